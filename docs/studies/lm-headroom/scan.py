"""The LM lab's headroom scan (docs/studies/lm-headroom): GRPO vs the oracle credits on SmolLM2-135M at 100 updates,
over cells declared before any run; then 6 units for the flagged cells and the best one.

    python docs/studies/lm-headroom/scan.py --stage screen --cells default-lr5e-6 --out runs/lm-headroom
    python docs/studies/lm-headroom/scan.py --stage confirm --cells CELL --out runs/lm-headroom
    python docs/studies/lm-headroom/scan.py --stage table --out runs/lm-headroom   # scan.json, scan.md, scan.png

Every stage resumes (``oar compare --resume``): a cell's finished runs are kept, so an interrupted scan continues.
Each cell is one ``oar compare --lab smollm2`` directory ``OUT/CELL`` with its results.json / results.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# the grid, declared in docs/studies/lm-headroom/README.md before any run: cell -> (regime, task fields, RL lr)
CELLS: dict[str, tuple[str | None, dict, float]] = {
    "default-lr5e-6": (None, {}, 5e-6),
    "default-lr2e-5": (None, {}, 2e-5),
    "default-lr5e-5": (None, {}, 5e-5),
    "long": ("long", {}, 5e-6),
    "distract": ("distract", {}, 5e-6),
    "verbose": ("verbose", {}, 5e-6),
    "words": (None, {"phrasing": "words"}, 5e-6),
}
HORIZON = 100  # updates per run (max_steps): the declared view is equal updates
BUDGET_S = 1e6  # training CPU-s: never the binding limit (the horizon is)
PROTOCOL = {"eval_every": 20, "eval_problems": 128, "eval_k": 2}
SCREEN_CREDITS = ("grpo", "oracle-process", "oracle-blame", "oracle-oar")
PRACTICAL_CREDITS = ("oar-g", "oar-p@horizon=2", "oar-prefix@rule=sign", "vine-w", "sc-grpo", "grail", "shuffle:oar-g")
SEEDS = 3  # RL seeds per warm start
SCREEN_WARM, CONFIRM_WARM = 1, 2  # warm starts: 0 (screen, 3 units), 0-1 (confirm, 6 units)
FLAG_POINTS = 5.0  # screen: a cell is flagged when its best oracle's mean gap at update 100 is at least this
CLAIM_POINTS = 5.0  # headroom: the best oracle's gap at update 100 >= this with its Welch 95 % CI excluding 0


def cell_config(cell: str):
    """The :class:`oar.lab.run.RunConfig` every run of ``cell`` starts from: the LM lab's recipe and protocol with the
    cell's task and learning rate, the scan's horizon and evaluation, fp32 numerics (the warm start's ``bf16=False``:
    one numerics on every machine)."""
    from oar.lab.compare import PRESETS, base_config
    from oar.lab.lm import LMWarmStartConfig

    regime, task, lr = CELLS[cell]
    overrides = {"warm": LMWarmStartConfig(bf16=False), "lr": lr, "max_steps": HORIZON, "budget_s": BUDGET_S,
                 **PROTOCOL, **({"task": task} if task else {})}
    return base_config(PRESETS["default"], regime, overrides, lab="smollm2")


def run_cell(cell: str, out: Path, credits: tuple[str, ...], warm_seeds: int, workers: int) -> dict:
    """One cell as a resumed ``oar compare --lab smollm2`` into ``out/cell``; returns its results object."""
    from oar.lab.compare import compare
    from oar.lab.summary import print_summary

    results = compare(out / cell, cell_config(cell), credits, seeds=SEEDS, warm_seeds=warm_seeds, resume=True,
                      workers=workers, progress=sys.stdout.isatty())
    print_summary(results, out / cell)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", choices=("screen", "confirm", "practical", "table"), required=True)
    p.add_argument("--cells", default=",".join(CELLS), help=f"comma-separated, of: {', '.join(CELLS)}")
    p.add_argument("--out", default="runs/lm-headroom")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    unknown = [c for c in cells if c not in CELLS]
    if unknown:
        p.error(f"unknown cell(s) {unknown}; cells: {', '.join(CELLS)}")
    out = Path(args.out)
    if args.stage == "table":
        from oar.lab.headroom_scan import write_scan_table

        write_scan_table(out, list(CELLS), CLAIM_POINTS, FLAG_POINTS, HORIZON)
        return 0
    credits = {"screen": SCREEN_CREDITS, "confirm": SCREEN_CREDITS,
               "practical": ("grpo", *PRACTICAL_CREDITS)}[args.stage]
    warm = SCREEN_WARM if args.stage == "screen" else CONFIRM_WARM
    for cell in cells:  # one cell at a time, each complete before the next
        run_cell(cell, out, credits, warm, args.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
