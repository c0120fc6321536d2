"""The credit-headroom scan (docs/studies/headroom): GRPO vs the oracle credits over a grid declared
before any run, then the confirmation of the best cell at 6 seeds.

    python docs/studies/headroom/headroom_scan.py --stage screen --out runs/headroom      # every cell, seeds 0-2
    python docs/studies/headroom/headroom_scan.py --stage confirm --cells long-b16 --out runs/headroom  # seeds 0-5
    python docs/studies/headroom/headroom_scan.py --stage table --out runs/headroom   # scan.json, scan.md, scan.png

Every stage resumes: a cell's finished runs are kept (``oar compare --resume``), so an interrupted scan continues.
Each cell is one ``oar compare`` directory ``OUT/CELL`` with its own results.json / results.md / report.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from oar.lab.regimes import REGIMES

LONG_B16 = REGIMES["long-b16"]  # the confirmed cell is a regime preset now: one home for its settings
# the grid, declared in docs/studies/headroom/README.md before any run: regime, RunConfig overrides
BUDGET_S = 100.0
EVAL = {"eval_problems": 256, "eval_k": 2}
CELLS: dict[str, tuple[str, dict]] = {
    "long-b16": ("long", {**LONG_B16.recipe, "eval_every": LONG_B16.protocol["eval_every"]}),  # the regime preset
    "long-b16-lr2": ("long", {"prompts_per_step": 4, "group_size": 4, "lr": 2e-4, "eval_every": 25}),
    "long-b128-lr2": ("long", {"lr": 2e-4, "eval_every": 5}),
    "chain10-b16": ("chain10", {"prompts_per_step": 4, "group_size": 4, "lr": 1e-4, "eval_every": 25}),
}
SCREEN_CREDITS = ("grpo", "oracle-blame", "oracle-process", "oracle-oar")
SCREEN_SEEDS, CONFIRM_SEEDS = 3, 6
CLAIM_POINTS = 5.0  # the headroom bar: best oracle - GRPO at the same number of updates, 95% CI excluding 0


def run_cell(cell: str, out: Path, credits: tuple[str, ...], seeds: int) -> dict:
    """One cell as an ``oar compare`` (resumed) into ``out/cell``; returns its results object."""
    from oar.lab.compare import PRESETS, base_config, compare
    from oar.lab.summary import print_summary

    regime, run = CELLS[cell]
    base = base_config(PRESETS["default"], regime, {**EVAL, **run, "budget_s": BUDGET_S})
    results = compare(out / cell, base, credits, seeds=seeds, resume=True, progress=sys.stdout.isatty())
    print_summary(results, out / cell)
    return results


def scan_table(out: Path) -> dict:
    """The scan over every cell run so far: per cell and credit the Δ vs GRPO at the same number of updates and at
    the same budget, the mean-accuracy (AUC) differences, seeds; the best oracle per cell and whether it meets the
    claim. Written to ``out/scan.json``, ``out/scan.md`` and ``out/scan.png``."""
    from oar.files import atomic_write
    from oar.lab.summary import is_oracle

    rows, cells = [], {}
    for cell in CELLS:
        path = out / cell / "results.json"
        if not path.is_file():
            continue
        res = json.loads(path.read_text(encoding="utf-8"))
        grpo = res["credits"]["grpo"]
        oracles = {c: a for c, a in res["credits"].items() if is_oracle(c)}
        best = max(oracles, key=lambda c: oracles[c]["matched_diff"]["mean"]) if oracles else None
        for c, a in res["credits"].items():
            rows.append({"cell": cell, "credit": c, "seeds": a["final_accuracy"]["n"],
                         "grpo_start": grpo["start_accuracy"]["mean"], "grpo_final": grpo["final_accuracy"]["mean"],
                         "final": a["final_accuracy"]["mean"], "matched_step": a["matched_step"],
                         "matched_diff": a["matched_diff"], "final_diff": a["final_diff"],
                         "auc_updates_diff": a.get("auc_updates_diff"), "steps": a["steps"]["mean"]})
        if best:
            d = oracles[best]["matched_diff"]
            lo = d["mean"] - d["ci95"] if d["ci95"] == d["ci95"] else None
            cells[cell] = {"best_oracle": best, "matched_diff": d, "seeds": oracles[best]["final_accuracy"]["n"],
                           "meets_claim": bool(d["mean"] * 100 >= CLAIM_POINTS and lo is not None and lo > 0)}
    scan = {"budget_s": BUDGET_S, "eval": EVAL, "cells": {c: {"regime": r, "run": o} for c, (r, o) in CELLS.items()},
            "claim_points": CLAIM_POINTS, "rows": rows, "best": cells}
    atomic_write(out / "scan.json", json.dumps(scan, indent=1))
    atomic_write(out / "scan.md", _markdown(rows, cells))
    _plot(rows, out / "scan.png")
    return scan


def _markdown(rows: list[dict], cells: dict) -> str:
    from oar.lab.summary import format_diff

    head = ("| cell | credit | seeds | GRPO start → final | final | Δ same updates (@step) | Δ same budget "
            "| Δ mean acc over updates | steps |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(f"| {r['cell']} | {r['credit']} | {r['seeds']} | {100 * r['grpo_start']:.1f} → "
                     f"{100 * r['grpo_final']:.1f} | {100 * r['final']:.1f} | {format_diff(r['matched_diff'])} "
                     f"(@{r['matched_step']}) | {format_diff(r['final_diff'])} | {format_diff(r['auc_updates_diff'])} "
                     f"| {r['steps']:.0f} |")
    lines += ["", "| cell | best oracle | seeds | Δ same updates [95% CI] | ≥ 5 points, CI excluding 0 |",
              "|---|---|---|---|---|"]
    for cell, b in cells.items():
        lines.append(f"| {cell} | {b['best_oracle']} | {b['seeds']} | {format_diff(b['matched_diff'])} "
                     f"| {'yes' if b['meets_claim'] else 'no'} |")
    return "\n".join(lines) + "\n"


def _plot(rows: list[dict], path: Path) -> None:
    """Δ vs GRPO at the same number of updates, per cell and credit, with 95% CIs (one PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from oar.viz.plots import save_png

    cells = list(dict.fromkeys(r["cell"] for r in rows))
    credits = [c for c in dict.fromkeys(r["credit"] for r in rows) if c != "grpo"]
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(cells), 3.6))
    width = 0.8 / max(len(credits), 1)
    for j, c in enumerate(credits):
        pts = [(i, r) for i, cell in enumerate(cells) for r in rows if r["cell"] == cell and r["credit"] == c]
        xs = [i + (j - (len(credits) - 1) / 2) * width for i, _ in pts]
        ys = [100 * r["matched_diff"]["mean"] for _, r in pts]
        es = [100 * (r["matched_diff"]["ci95"] or 0) if r["matched_diff"]["ci95"] == r["matched_diff"]["ci95"] else 0
              for _, r in pts]
        ax.bar(xs, ys, width, yerr=es, capsize=2, label=c)
    ax.axhline(0, color="k", lw=0.8)
    ax.axhline(CLAIM_POINTS, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(cells)), cells, fontsize=8)
    ax.set_ylabel("Δ held-out acc vs GRPO, same updates (points)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", choices=("screen", "confirm", "table"), required=True)
    p.add_argument("--cells", default=",".join(CELLS), help=f"comma-separated, of: {', '.join(CELLS)}")
    p.add_argument("--credits", default=",".join(SCREEN_CREDITS))
    p.add_argument("--out", default="runs/headroom")
    args = p.parse_args(argv)
    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    unknown = [c for c in cells if c not in CELLS]
    if unknown:
        p.error(f"unknown cell(s) {unknown}; cells: {', '.join(CELLS)}")
    out = Path(args.out)
    if args.stage != "table":
        seeds = SCREEN_SEEDS if args.stage == "screen" else CONFIRM_SEEDS
        for cell in cells:
            run_cell(cell, out, tuple(c.strip() for c in args.credits.split(",") if c.strip()), seeds)
    scan = scan_table(out)
    print((out / "scan.md").read_text(encoding="utf-8"))
    return 0 if scan["rows"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
