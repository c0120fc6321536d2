"""``oar report``: learning curves (PNG) and a Markdown report for run directories."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report", help="learning curves and report.md for run directories",
        description="Plot every logged metric (one line per credit method, band over seeds) and write report.md "
        "with the summary and results tables.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories, or directories holding them")
    p.add_argument("--out", metavar="DIR",
                   help="output directory (default: RUN_DIR/report for one run, else report/ in their common parent)")
    p.add_argument("--results", metavar="FILE", help="results JSON for the results table "
                   "(default: results.json next to the run directories)")
    p.add_argument("--x", choices=("step", "wall_time"), default="step", help="x axis of the curves")
    p.add_argument("--group-by", choices=("credit", "run"), default="credit",
                   help="one line per credit method with a band over seeds, or one line per run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from oar.viz.report import write_report

    results = None
    if args.results:
        if not os.path.isfile(args.results):
            raise FileNotFoundError(f"results file not found: {args.results}")
        results = json.loads(Path(args.results).read_text(encoding="utf-8"))
    dirs = [Path(d) for d in args.run_dirs]
    if args.out:
        out = Path(args.out)
    elif len(dirs) == 1:
        out = dirs[0] / "report"
    else:
        out = Path(os.path.commonpath([d.resolve() for d in dirs])) / "report"
    print(f"wrote {write_report(dirs, out, results, x=args.x, group_by=args.group_by)}")
    return 0
