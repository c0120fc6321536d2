"""The table of a headroom scan over ``oar compare`` cells (docs/studies/lm-headroom): per cell, GRPO's curve and each
credit's gap to GRPO at equal updates and at GRPO's training seconds, the best oracle and the declared rules.

A cell is one ``oar compare`` output directory ``OUT/CELL`` (its ``results.json``, :func:`oar.lab.summary.
summarize_comparison`); every figure here is read from it.
"""

from __future__ import annotations

import json
from pathlib import Path

from oar.lab.stats import accuracy_at, diff_ci, mean_ci
from oar.lab.summary import format_diff, is_oracle


def _mean_curve(runs: list[dict]) -> list[tuple[int, float]]:
    """(update, mean held-out accuracy over ``runs``) at the updates every run evaluated."""
    steps = sorted(set.intersection(*(set(p[0] for p in r["curve"]) for r in runs)))
    return [(s, sum(accuracy_at(r["curve"], s) for r in runs) / len(runs)) for s in steps]


def _at_seconds(run: dict, seconds: float) -> float:
    """A run's accuracy after ``seconds`` training seconds (its last evaluation when it stopped before)."""
    last = run["curve"][-1]
    return last[2] if seconds >= last[1] else accuracy_at(run["curve"], seconds, axis=1)


def cell_rows(results: dict, horizon: int) -> tuple[dict, list[dict]]:
    """(GRPO's curve summary, one row per credit) of one cell's ``results.json``."""
    runs = results["runs"]
    ref = results["reference"]
    by_unit = {}
    for r in runs:
        by_unit.setdefault(r["credit"], {})[r["seed"]] = r
    grpo = list(by_unit[ref].values())
    curve = _mean_curve(grpo)
    start, end = curve[0][1], curve[-1][1]
    grpo_summary = {"units": len(grpo), "start": start, "peak": max(a for _, a in curve), "end": end,
                    "peak_step": max(curve, key=lambda p: p[1])[0], "drifts_below_start": end < start,
                    "curve": curve}
    rows = []
    for credit, units in by_unit.items():
        agg = results["credits"][credit]
        mine = list(units.values())
        row = {"credit": credit, "units": len(mine), "matched_step": agg.get("matched_step"),
               "matched_diff": agg.get("matched_diff"),
               "train_seconds": mean_ci([r["train_seconds"] for r in mine]),
               "s_per_update": mean_ci([r["train_seconds"] / max(r["steps"], 1) for r in mine]),
               "final": mean_ci([accuracy_at(r["curve"], min(horizon, r["curve"][-1][0])) for r in mine])}
        if credit != ref:  # at GRPO's training seconds for its horizon, unit by unit
            pairs = [(units[u], by_unit[ref][u]) for u in units if u in by_unit[ref]]
            row["seconds_diff"] = diff_ci([_at_seconds(m, g["train_seconds"]) for m, g in pairs],
                                          [g["curve"][-1][2] for _, g in pairs])
        rows.append(row)
    return grpo_summary, rows


def write_scan_table(out: Path, cells: list[str], claim_points: float, flag_points: float, horizon: int) -> dict:
    """``out/scan.json``, ``out/scan.md`` and ``out/scan.png`` from every cell of ``cells`` with a ``results.json``:
    the best oracle per cell (largest mean gap at equal updates), whether the screen's rule flags it (mean gap >=
    ``flag_points``) and whether it meets the claim (gap >= ``claim_points`` with its Welch 95 % CI excluding 0)."""
    from oar.files import atomic_write, strict_json

    table = {}
    for cell in cells:
        path = out / cell / "results.json"
        if not path.is_file():
            continue
        grpo, rows = cell_rows(json.loads(path.read_text(encoding="utf-8")), horizon)
        oracles = [r for r in rows if is_oracle(r["credit"])]
        best = max(oracles, key=lambda r: r["matched_diff"]["mean"]) if oracles else None
        verdict = None
        if best is not None:
            d = best["matched_diff"]
            ci = d["ci95"] if d["ci95"] == d["ci95"] else None
            verdict = {"best_oracle": best["credit"], "gap": d, "units": best["units"],
                       "flagged": 100 * d["mean"] >= flag_points,
                       "headroom": bool(100 * d["mean"] >= claim_points and ci is not None and d["mean"] - ci > 0)}
        table[cell] = {"grpo": grpo, "rows": rows, "verdict": verdict}
    best_cell = max((c for c in table if table[c]["verdict"]), default=None,
                    key=lambda c: table[c]["verdict"]["gap"]["mean"])
    scan = {"horizon": horizon, "flag_points": flag_points, "claim_points": claim_points, "cells": table,
            "best_cell": best_cell}
    atomic_write(out / "scan.json", strict_json(scan, indent=1))
    atomic_write(out / "scan.md", _markdown(table, best_cell))
    _plot(table, out / "scan.png")
    return scan


def _markdown(table: dict, best_cell: str | None) -> str:
    lines = ["| cell | units | GRPO start → peak (@update) → end | drifts below start | credit | Δ equal updates "
             "(@update) | Δ at GRPO's CPU s | CPU s / update |", "|---|---|---|---|---|---|---|---|"]
    for cell, t in table.items():
        g = t["grpo"]
        for r in t["rows"]:
            lines.append(
                f"| {cell} | {r['units']} | {100 * g['start']:.1f} → {100 * g['peak']:.1f} (@{g['peak_step']}) → "
                f"{100 * g['end']:.1f} | {'yes' if g['drifts_below_start'] else 'no'} | `{r['credit']}` | "
                f"{format_diff(r['matched_diff']) if r['credit'] != 'grpo' else '–'} (@{r['matched_step']}) | "
                f"{format_diff(r.get('seconds_diff')) if 'seconds_diff' in r else '–'} | "
                f"{r['s_per_update']['mean']:.1f} |")
    lines += ["", "| cell | best oracle | units | Δ equal updates [Welch 95 %] | flagged (mean ≥ flag) | headroom "
              "(≥ claim, CI excluding 0) |", "|---|---|---|---|---|---|"]
    for cell, t in table.items():
        v = t["verdict"]
        if v:
            lines.append(f"| {cell}{' (best)' if cell == best_cell else ''} | `{v['best_oracle']}` | {v['units']} | "
                         f"{format_diff(v['gap'])} | {'yes' if v['flagged'] else 'no'} | "
                         f"{'yes' if v['headroom'] else 'no'} |")
    return "\n".join(lines) + "\n"


def _plot(table: dict, path: Path) -> None:
    """Per cell: GRPO's and each oracle's mean held-out accuracy over updates (one panel a cell, one PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from oar.viz.plots import save_png

    cells = list(table)
    if not cells:
        return
    fig, axes = plt.subplots(1, len(cells), figsize=(3.0 * len(cells), 3.0), squeeze=False, sharey=True)
    for ax, cell in zip(axes[0], cells, strict=True):
        results = json.loads((path.parent / cell / "results.json").read_text(encoding="utf-8"))
        by_credit = {}
        for r in results["runs"]:
            by_credit.setdefault(r["credit"], []).append(r)
        for credit, runs in by_credit.items():
            xs, ys = zip(*_mean_curve(runs), strict=True)
            ax.plot(xs, [100 * y for y in ys], label=credit, lw=2.0 if credit == results["reference"] else 1.2)
        ax.set_title(cell, fontsize=9)
        ax.set_xlabel("updates")
    axes[0][0].set_ylabel("held-out accuracy (%)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
