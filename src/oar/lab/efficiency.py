"""The credit-efficiency table of an ``oar compare`` directory with oracle columns: every credit as a share of the best
oracle's headroom over GRPO in both views (same updates, same budget), the declared claim rule
(docs/studies/efficiency) and the cost per update.

``write_efficiency(compare_dir, out)`` writes ``OUT/results.json`` and ``OUT/results.md`` (copies),
``OUT/efficiency.json``, ``OUT/efficiency.md``, ``OUT/efficiency.png`` and ``OUT/curves.png`` (accuracy against
updates, a panel per credit, GRPO and the best oracle in each). The study's driver is
``docs/studies/efficiency/efficiency_table.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from oar.files import atomic_write
from oar.lab.summary import format_diff, is_oracle
from oar.viz.plots import band, save_png


def _above_zero(d: dict | None) -> bool:
    """A Welch difference ``{"mean", "ci95"}`` whose 95% interval lies above 0."""
    return bool(d and d.get("mean") is not None and d.get("ci95") is not None and d["mean"] - d["ci95"] > 0)


def _below_zero(d: dict | None) -> bool:
    """A Welch difference whose 95% interval lies below 0."""
    return bool(d and d.get("mean") is not None and d.get("ci95") is not None and d["mean"] + d["ci95"] < 0)


def _interval_above_zero(e: dict | None) -> bool:
    """A bootstrap interval ``{"mean", "lo", "hi"}`` that lies above 0."""
    return bool(e and e.get("lo") is not None and e["lo"] > 0)


def verdict(diff: dict | None, eff: dict | None, positive: str = "captures headroom") -> str:
    """The declared claim rule of one view: ``positive`` when Δ vs GRPO has its Welch CI above 0 and the efficiency
    interval lies above 0; "below GRPO" when the Welch CI lies under 0; otherwise "not distinguishable"."""
    if _above_zero(diff) and _interval_above_zero(eff):
        return positive
    return "below GRPO" if _below_zero(diff) else "not distinguishable"


def budget_binds(results: dict) -> bool:
    """Whether the same-budget view compares equal compute: False when a ``max_steps`` cap stopped every run before
    its budget (then "the same budget" is the same number of updates, and cost per update goes unseen)."""
    cap = (results.get("config") or {}).get("max_steps")
    runs = results.get("runs") or []
    return not (cap is not None and runs and all(r["steps"] >= cap for r in runs))


def _mean(stat: dict | None) -> float | None:
    """A statistic's mean; None when missing or NaN (results.json holds null, a summary in memory NaN)."""
    m = (stat or {}).get("mean")
    return None if m is None or m != m else m


def efficiency_rows(results: dict) -> list[dict]:
    """One row per credit: both views' Δ and efficiency, the verdicts (None for the reference), and the cost per
    update (CPU s and its ratio to the reference, scoring share, generated tokens; None where not logged)."""
    ref = results["reference"]
    creds = results["credits"]
    ref_cost = creds[ref]["train_seconds"]["mean"] / creds[ref]["steps"]["mean"]
    batch = results["config"]["prompts_per_step"] * results["config"]["group_size"]
    binds = budget_binds(results)
    no_budget_view = f"no budget view (every run stopped at {results['config'].get('max_steps')} updates)"
    rows = []
    for c, a in creds.items():
        per_update = a["train_seconds"]["mean"] / a["steps"]["mean"]
        length = _mean(a.get("completion_length"))
        rows.append({
            "credit": c, "reference": c == ref, "oracle": is_oracle(c), "seeds": a["final_accuracy"]["n"],
            "final": a["final_accuracy"]["mean"], "steps": a["steps"]["mean"],
            "matched_step": a.get("matched_step"), "matched_diff": a.get("matched_diff"),
            "final_diff": a.get("final_diff"), "auc_updates_diff": a.get("auc_updates_diff"),
            "efficiency_step": a.get("efficiency_step"), "efficiency_updates": a.get("efficiency_updates"),
            "efficiency_budget": a.get("efficiency_budget"),
            "verdict_updates": None if c == ref else verdict(a.get("matched_diff"), a.get("efficiency_updates")),
            "verdict_budget": None if c == ref else (
                verdict(a.get("final_diff"), a.get("efficiency_budget"), "pays at equal compute") if binds
                else no_budget_view),
            "cpu_s_per_update": per_update, "cost_vs_ref": per_update / ref_cost,
            "importance_share": _mean(a.get("importance_share")), "rollout_tokens": _mean(a.get("rollout_tokens")),
            "completion_tokens": None if length is None else length * batch,
        })
    return rows


def _eff(e: dict | None) -> str:
    if not e or e.get("mean") is None:
        return "–"
    lo, hi = e.get("lo"), e.get("hi")
    return f"{e['mean']:+.2f} [{lo:+.2f}, {hi:+.2f}]" if lo is not None and hi is not None else f"{e['mean']:+.2f}"


def _num(x: float | None, fmt: str) -> str:
    return "–" if x is None or x != x else format(x, fmt)


def markdown(results: dict, rows: list[dict]) -> str:
    """The efficiency table (``efficiency.md``): one row per credit, the reference first as the results hold it."""
    best = results["credits"][results["reference"]].get("best_oracle")
    head = ("| credit | seeds | final | Δ same updates (@step) | efficiency, same updates | Δ same budget "
            "| efficiency, same budget | Δ mean acc over updates | updates | CPU s / update (× GRPO) | scoring share "
            "| generated tokens / update (extra) | verdict: same updates / same budget |")
    lines = [f"Best oracle: `{best}`. Efficiency = (credit − GRPO) / (best oracle − GRPO), paired bootstrap 95 % "
             "interval over seeds; Δ in points [Welch 95 % CI]. Verdict by the declared rule (docs/studies/efficiency)."
             + ("" if budget_binds(results) else
                f" Every run stopped at max_steps = {results['config']['max_steps']} before its budget: the "
                "same-budget columns repeat the same-updates view, not equal compute."), "",
             head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        extra = f" (+{r['rollout_tokens']:.0f})" if r["rollout_tokens"] else ""
        share = _num(None if r["importance_share"] is None else 100 * r["importance_share"], ".0f")
        verdicts = "reference" if r["reference"] else f"{r['verdict_updates']} / {r['verdict_budget']}"
        eff_u, eff_b = ("–", "–") if r["reference"] else (_eff(r["efficiency_updates"]), _eff(r["efficiency_budget"]))
        lines.append(
            f"| {r['credit']} | {r['seeds']} | {100 * r['final']:.1f} | {format_diff(r['matched_diff'])} "
            f"(@{r['matched_step']}) | {eff_u} | {format_diff(r['final_diff'])} | {eff_b} "
            f"| {format_diff(r['auc_updates_diff'])} | {r['steps']:.0f} "
            f"| {r['cpu_s_per_update']:.2f} ({r['cost_vs_ref']:.1f}×) | {share}{'%' if share != '–' else ''} "
            f"| {_num(r['completion_tokens'], '.0f')}{extra} | {verdicts} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """Credit efficiency per credit (the reference and credits without one left out), both views, with the
    bootstrap intervals; the y range covers every interval (one PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if not r["reference"] and _mean(r["efficiency_updates"]) is not None]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows)), 4.2))
    for j, (key, label) in enumerate((("efficiency_updates", "same updates"), ("efficiency_budget", "same budget"))):
        pts = [(i + (j - 0.5) * 0.38, r[key]) for i, r in enumerate(rows) if _mean(r[key]) is not None]
        ys = [e["mean"] for _, e in pts]
        lo = [e["mean"] - e["lo"] if e.get("lo") is not None else 0.0 for _, e in pts]
        hi = [e["hi"] - e["mean"] if e.get("hi") is not None else 0.0 for _, e in pts]
        ax.bar([x for x, _ in pts], ys, 0.38, yerr=[lo, hi], capsize=2, label=label)
    ax.axhline(0, color="k", lw=0.8)
    ax.axhline(1, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(rows)), [r["credit"] for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("share of the oracle's gain")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def plot_curves(results: dict, path: Path) -> None:
    """Held-out accuracy against updates, one panel per credit: its mean and min-max band over seeds, with the
    reference's and the best oracle's means in every panel (one PNG)."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ref = results["reference"]
    best = results["credits"][ref].get("best_oracle")
    curves: dict[str, list] = {}
    for run in results["runs"]:
        steps, _, accs = zip(*run["curve"], strict=True)
        curves.setdefault(run["credit"], []).append((np.array(steps, float), 100 * np.array(accs, float)))
    panels = [c for c in curves if c not in (ref, best)]
    cols = max(1, min(4, len(panels)))
    rows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.3 * rows), sharex=True, sharey=True, squeeze=False)
    lines = {c: band(curves[c])[:2] for c in (ref, best) if c in curves}
    for ax, c in zip(axes.flat, panels, strict=False):
        x, mean, lo, hi = band(curves[c])
        ax.fill_between(x, lo, hi, color="C0", alpha=0.2, lw=0)
        ax.plot(x, mean, color="C0", lw=1.6, label=c)
        for other, style in ((ref, {"color": "k", "lw": 1.0}), (best, {"color": "C3", "lw": 1.0, "ls": "--"})):
            if other in lines:
                ax.plot(*lines[other], **style, label=other)
        ax.set_title(c, fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=6, loc="upper left")
    fig.supxlabel("updates", fontsize=8)
    fig.supylabel("held-out accuracy (points)", fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=110)


def write_efficiency(compare_dir: str | Path, out: str | Path) -> Path:
    """Check ``compare_dir`` (its ``results.json`` and ``results.md``, a config with the batch shape, an oracle
    column) and ``out`` before writing anything (ValueError naming what is wrong), then write the copies and the
    efficiency files into ``out``; returns the path of ``efficiency.md``."""
    src, out = Path(compare_dir), Path(out)
    for name in ("results.json", "results.md"):
        if not (src / name).is_file():
            raise ValueError(f"no {name} in {str(compare_dir)!r}")
    if out.resolve() == src.resolve():
        raise ValueError(f"--out {str(out)!r} is the compare directory itself; give another")
    results = json.loads((src / "results.json").read_text(encoding="utf-8"))
    if not {"prompts_per_step", "group_size"} <= set(results.get("config") or {}):
        raise ValueError(f"{str(src / 'results.json')!r} has no config with prompts_per_step and group_size")
    if not any(is_oracle(c) for c in results["credits"]):
        raise ValueError(f"{str(src / 'results.json')!r} has no oracle column: credit efficiency needs one")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("results.json", "results.md"):
        shutil.copyfile(src / name, out / name)
    rows = efficiency_rows(results)
    atomic_write(out / "efficiency.json", json.dumps({"source": str(src / "results.json"), "rows": rows}, indent=1))
    atomic_write(out / "efficiency.md", markdown(results, rows))
    plot(rows, out / "efficiency.png")
    plot_curves(results, out / "curves.png")
    return out / "efficiency.md"
