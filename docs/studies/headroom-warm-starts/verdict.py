"""The warm-start check's table and verdict by its declared rule (issue #33 §0; protocol in README.md).

Usage: ``python docs/studies/headroom-warm-starts/verdict.py RUNS_DIR [--out DIR]``. Reads the run directories
``oar compare --warm-seeds 4 --seeds 3`` wrote (``grpo-s0``, ``oracle-process-w2-s1``, ...), takes each run's
held-out sampled accuracy at its start and at update 140 (the run's final evaluation), and writes ``verdict.json``
and ``verdict.md``: per warm start, both credits' start, final and gap; over the 12 (warm start, RL seed) units,
``oracle-process`` − GRPO with its Welch 95 % interval; and the rule's verdict.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from oar.files import atomic_write
from oar.lab.compare import run_name
from oar.lab.stats import diff_ci, mean_ci
from oar.rundir import RunDir

CREDITS = ("grpo", "oracle-process")
WARM_SEEDS, SEEDS, UPDATES = 4, 3, 140


def read_units(runs: Path) -> dict[str, dict[tuple[int, int], dict[str, float]]]:
    """credit -> (warm start, seed) -> start/final accuracy (percent) and the final's update; finished runs only."""
    table: dict[str, dict[tuple[int, int], dict[str, float]]] = {c: {} for c in CREDITS}
    for credit in CREDITS:
        for w in range(WARM_SEEDS):
            for seed in range(SEEDS):
                summary = RunDir(runs / run_name(credit, w, seed)).summary()
                if summary is None:
                    continue
                table[credit][(w, seed)] = {"start": 100 * summary["start"]["eval/accuracy"],
                                            "final": 100 * summary["final"]["eval/accuracy"],
                                            "update": summary["final"]["step"]}
    return table


def verdict(table: dict) -> dict:
    """The declared rule: the 12-unit Welch interval of oracle − GRPO at update 140 excludes 0 with a positive
    mean, and the per-warm-start mean gap is positive for at least 3 of the 4 warm starts."""
    units = sorted(set(table["grpo"]) & set(table["oracle-process"]))
    gaps = {w: [table["oracle-process"][u]["final"] - table["grpo"][u]["final"] for u in units if u[0] == w]
            for w in range(WARM_SEEDS)}
    per_warm = {}
    for w in range(WARM_SEEDS):
        mine = [u for u in units if u[0] == w]
        if not mine:
            continue
        per_warm[w] = {c: {"start": mean_ci([table[c][u]["start"] for u in mine])["mean"],
                           "final": mean_ci([table[c][u]["final"] for u in mine])} for c in CREDITS}
        per_warm[w]["gap"] = sum(gaps[w]) / len(gaps[w])
        per_warm[w]["units"] = len(mine)
    overall = diff_ci([table["oracle-process"][u]["final"] for u in units], [table["grpo"][u]["final"] for u in units])
    significant = overall["mean"] > 0 and overall["mean"] - overall["ci95"] > 0
    positive_warm = sum(1 for w in per_warm if per_warm[w]["gap"] > 0)
    complete = len(units) == WARM_SEEDS * SEEDS
    robust = significant and positive_warm >= 3
    return {"units": len(units), "complete": complete, "diff": overall, "per_warm": per_warm,
            "warm_starts_with_positive_gap": positive_warm, "significant": significant,
            "robust": robust if complete else None,
            "updates": sorted({table[c][u]["update"] for c in CREDITS for u in units})}


def markdown(result: dict) -> str:
    d = result["diff"]
    lines = ["| warm start | units | GRPO start | GRPO @140 | oracle-process start | oracle-process @140 | gap |",
             "|---|---|---|---|---|---|---|"]
    for w, row in sorted(result["per_warm"].items()):
        g, o = row["grpo"], row["oracle-process"]
        lines.append(f"| {w} | {row['units']} | {g['start']:.1f} | {g['final']['mean']:.1f} ± {g['final']['std']:.1f} "
                     f"| {o['start']:.1f} | {o['final']['mean']:.1f} ± {o['final']['std']:.1f} | {row['gap']:+.1f} |")
    lines += ["", f"oracle-process − GRPO at update 140 over {result['units']} units: **{d['mean']:+.1f} "
                  f"[±{d['ci95']:.1f}]** (Welch 95 %); warm starts with a positive mean gap: "
                  f"{result['warm_starts_with_positive_gap']} of {len(result['per_warm'])}.",
              "", "Verdict by the declared rule: " + (
                  "incomplete (not every unit finished)" if result["robust"] is None else
                  "**headroom robust across warm starts**" if result["robust"] else
                  "**no robust headroom** in `long-b16`"),
              "", "(± after a mean over the units of a warm start: their s.d.; accuracy in %, held-out, sampled.)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    result = verdict(read_units(args.runs))
    text = markdown(result)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write(args.out / "verdict.json", json.dumps(result, indent=1, default=str))
        atomic_write(args.out / "verdict.md", text)


if __name__ == "__main__":
    main()
