"""The decomposition's table, plot and verdict by its declared rule (issue #33 §2; protocol in README.md).

Usage: ``python docs/studies/decomposition/table.py RUNS_DIR [--warm-seeds 2] [--seeds 3] [--columns A,B] [--out DIR]
[--bilevel-default]``.
Reads the run directories ``oar compare --warm-seeds W --seeds S`` wrote for the screen's columns (importance ×
rule, ``oracle-process``, ``grpo``, the controls and peers), keeps every finished run, and aggregates them over the
(warm start, RL seed) units with :func:`oar.lab.summary.summarize_comparison` (GRPO the reference; the best perfect
cell, by Δ at equal updates, the oracle every efficiency is a share of). Per column: Δ vs GRPO at equal updates and
at equal CPU seconds (each column's and GRPO's held-out accuracy at the fewest training seconds any of their runs
reached, interpolated between evaluations), Welch 95 % intervals over units; credit efficiency at equal updates
with its paired bootstrap 95 % interval; CPU seconds per update; the two best practical cells (highest mean Δ at
equal updates, amendment 2) and each cell's Δ vs its own ``shuffle:`` control at equal updates. ``--columns``
keeps only those columns (and GRPO): the confirmation's table. Writes ``decomposition.json``, ``decomposition.md``
and ``decomposition.png`` (Δ per importance × rule, both views), and prints the Markdown.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from oar.files import atomic_write, strict_json
from oar.lab.compare import run_name
from oar.lab.stats import accuracy_at, diff_ci
from oar.lab.summary import format_diff, summarize_comparison
from oar.rundir import RunDir
from oar.viz.plots import save_png

RULES = ("bilevel", "sign", "process", "step")
IMPORTANCES = {  # row label -> column of that importance under a rule
    "perfect": "oracle-oar@rule={}",
    "OAR-G": "oar-g@rule={}",
    "OAR-P horizon=2": "oar-p@horizon=2&rule={}",
    "oar-prefix": "oar-prefix@rule={}",
}
OTHERS = ("oracle-process", "random", "sc-grpo", "grail")  # and any shuffle: control found in the directory
REFERENCE = "grpo"
# the LM lab's Bi-Level cells ran as the credits' registered defaults (amendment 3: the LM study's runs, whose
# directories carry the default names; `rule='bilevel'` is every importance credit's default): directory name ->
# grid column, with ``--bilevel-default``
DEFAULT_NAMES = {"oracle-oar": "oracle-oar@rule=bilevel", "oar-g": "oar-g@rule=bilevel",
                 "oar-p@horizon=2": "oar-p@horizon=2&rule=bilevel", "oar-prefix": "oar-prefix@rule=bilevel"}
DEFAULT_NAMES |= {f"shuffle:{k}": f"shuffle:{v}" for k, v in DEFAULT_NAMES.items()}


def grid_columns() -> list[str]:
    return [col.format(rule) for col in IMPORTANCES.values() for rule in RULES]


def finished_runs(runs: Path, warm_seeds: int, seeds: int, columns: list[str] | None = None,
                  bilevel_default: bool = False) -> dict[tuple[str, str], Path]:
    """(column, unit) -> run directory, for every finished run of the screen's columns (unit ``wW-sS``), or of
    ``columns`` only (GRPO always). ``bilevel_default``: a Bi-Level cell's runs are read from the directories of
    the credit's default name (``oar-g-s0`` for ``oar-g@rule=bilevel``; :data:`DEFAULT_NAMES`)."""
    on_disk = {v: k for k, v in DEFAULT_NAMES.items()} if bilevel_default else {}
    rename = DEFAULT_NAMES if bilevel_default else {}
    shuffles = sorted({rename.get(name, name) for name in
                       (p.name.rsplit("-s", 1)[0].split("-w")[0] for p in runs.glob("shuffle:*"))})
    dirs = {}
    for column in [REFERENCE, *(columns or [*grid_columns(), *OTHERS, *shuffles])]:
        for w in range(warm_seeds):
            for seed in range(seeds):
                path = runs / run_name(on_disk.get(column, column), w, seed)
                if RunDir(path).summary() is not None:
                    dirs[(column, f"w{w}-s{seed}")] = path
    return dirs


def runs_by_column(results: dict) -> dict[str, list[dict]]:
    """``summarize_comparison``'s per-run records grouped by column."""
    runs: dict[str, list[dict]] = {}
    for r in results["runs"]:
        runs.setdefault(r["credit"], []).append(r)
    return runs


def equal_seconds(results: dict) -> dict[str, dict]:
    """Per column: Δ vs GRPO of held-out accuracy at the fewest training seconds any run of the two reached."""
    runs = runs_by_column(results)
    out = {}
    for column, mine in runs.items():
        pair = mine + runs[REFERENCE]
        t = min(r["curve"][-1][1] for r in pair)
        if any(r["curve"][0][1] > t for r in pair):
            continue
        out[column] = {"seconds": t, **diff_ci([accuracy_at(r["curve"], t, axis=1) for r in mine],
                                                [accuracy_at(r["curve"], t, axis=1) for r in runs[REFERENCE]])}
    return out


def vs_control(results: dict) -> dict[str, dict]:
    """Per column ``X`` with a ``shuffle:X`` column: Δ of X − shuffle:X in held-out accuracy at the fewest updates
    any run of the two made, Welch 95 % CI over units: does the importance, rather than the rule, carry the gain?"""
    runs = runs_by_column(results)
    out = {}
    for column, mine in runs.items():
        control = runs.get(f"shuffle:{column}")
        if control is None:
            continue
        step = min(r["curve"][-1][0] for r in mine + control)
        out[column] = {"control": f"shuffle:{column}", "updates": step,
                       **diff_ci([accuracy_at(r["curve"], step) for r in mine],
                                 [accuracy_at(r["curve"], step) for r in control])}
    return out


def best_practical(rows: dict, n: int = 2) -> list[str]:
    """The ``n`` practical importance × rule cells with the highest mean Δ vs GRPO at equal updates (amendment 2)."""
    cells = [col.format(rule) for label, col in IMPORTANCES.items() if label != "perfect" for rule in RULES]
    ranked = [c for c in cells if (rows.get(c) or {}).get("equal_updates")]
    return sorted(ranked, key=lambda c: rows[c]["equal_updates"]["mean"], reverse=True)[:n]


def decompose(dirs: dict[tuple[str, str], Path]) -> dict:
    """The aggregate (``summarize_comparison``), the equal-seconds Δ, and the verdict of every rule and importance."""
    results = summarize_comparison(dirs, reference=REFERENCE)
    creds, seconds = results["credits"], equal_seconds(results)
    ref_cost = creds[REFERENCE]["train_seconds"]["mean"] / creds[REFERENCE]["steps"]["mean"]
    rows = {}
    for column, a in creds.items():
        rows[column] = {
            "units": a["final_accuracy"]["n"], "updates": a.get("matched_step"),
            "equal_updates": a.get("matched_diff"), "equal_seconds": seconds.get(column),
            "efficiency_updates": a.get("efficiency_updates"),
            "cpu_s_per_update": a["train_seconds"]["mean"] / a["steps"]["mean"],
        }
        rows[column]["cost_vs_grpo"] = rows[column]["cpu_s_per_update"] / ref_cost
    best = creds[REFERENCE].get("best_oracle")
    verdicts = {}
    for rule in RULES:
        d = (rows.get(IMPORTANCES["perfect"].format(rule)) or {}).get("equal_updates")
        verdicts[f"perfect@{rule}"] = (None if d is None else "turns perfect importance into gain"
                                       if d["mean"] - d["ci95"] > 0 else "no gain shown")
        for label, col in IMPORTANCES.items():
            if label == "perfect" or col.format(rule) not in rows:
                continue
            e = rows[col.format(rule)]["efficiency_updates"] or {}
            verdicts[f"{label}@{rule}"] = ("keeps a share" if (e.get("lo") or 0) > 0 else "no share shown")
    return {"best_perfect": best, "best_practical": best_practical(rows), "reference": REFERENCE, "rows": rows,
            "verdicts": verdicts, "vs_control": vs_control(results), "results": results}


def _eff(e: dict | None) -> str:
    if not e or e.get("mean") is None:
        return "–"
    return f"{e['mean']:+.2f} [{e['lo']:+.2f}, {e['hi']:+.2f}]" if e.get("lo") is not None else f"{e['mean']:+.2f}"


def markdown(d: dict, units: int) -> str:
    rows = d["rows"]

    def cell(column: str, key: str) -> str:
        r = rows.get(column)
        if r is None:
            return "not run"
        partial = "" if r["units"] == units else f" ({r['units']}/{units} units)"
        return format_diff(r[key]) + partial

    lines = [f"Δ vs GRPO in points [Welch 95 % CI over (warm start, RL seed) units]; best perfect cell "
             f"`{d['best_perfect']}`; efficiency = (cell − GRPO) / (best perfect − GRPO) at equal updates, paired "
             "bootstrap 95 % interval.", ""]
    for key, title in (("equal_updates", "equal updates"), ("equal_seconds", "equal CPU seconds")):
        lines += [f"**{title}**", "", "| importance | " + " | ".join(RULES) + " |", "|---" * (len(RULES) + 1) + "|"]
        for label, col in IMPORTANCES.items():
            lines.append(f"| {label} | " + " | ".join(cell(col.format(r), key) for r in RULES) + " |")
        lines.append("")
    head = "| column | units | Δ equal updates | Δ equal CPU s | efficiency | CPU s / update (× GRPO) | verdict |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    verdict_of = {IMPORTANCES[label].format(rule): v for k, v in d["verdicts"].items()
                  for label, rule in [k.split("@")]}
    for column, r in rows.items():
        lines.append(f"| `{column}` | {r['units']} | {format_diff(r['equal_updates'])} | "
                     f"{format_diff(r['equal_seconds'])} | {_eff(r['efficiency_updates'])} | "
                     f"{r['cpu_s_per_update']:.2f} ({r['cost_vs_grpo']:.1f}×) | {verdict_of.get(column, '')} |")
    lines += ["", "Best practical cells (highest mean Δ at equal updates): "
              + (", ".join(f"`{c}`" for c in d["best_practical"]) or "none"), ""]
    if d["vs_control"]:
        lines += ["Each cell vs its own `shuffle:` control (same importance and rule, weights permuted within the "
                  "completion), at equal updates [Welch 95 % CI over units]:", "",
                  "| column | control | updates | Δ vs control |", "|---|---|---|---|"]
        lines += [f"| `{c}` | `{v['control']}` | {v['updates']} | {format_diff(v)} |"
                  for c, v in d["vs_control"].items()]
    return "\n".join(lines) + "\n"


def plot(d: dict, path: Path) -> None:
    """Δ vs GRPO per importance (groups) × rule (bars), both views, Welch 95 % error bars; oracle-process dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    width = 0.8 / len(RULES)
    views = (("equal_updates", "equal updates"), ("equal_seconds", "equal CPU seconds"))
    for ax, (key, title) in zip(axes, views, strict=True):
        for j, rule in enumerate(RULES):
            xs, ys, es = [], [], []
            for i, col in enumerate(IMPORTANCES.values()):
                r = (d["rows"].get(col.format(rule)) or {}).get(key)
                if r and r.get("mean") is not None:
                    xs.append(i + (j - (len(RULES) - 1) / 2) * width)
                    ys.append(100 * r["mean"])
                    es.append(100 * r["ci95"] if r["ci95"] == r["ci95"] else 0)
            ax.bar(xs, ys, width, yerr=es, capsize=2, label=rule)
        ref = (d["rows"].get("oracle-process") or {}).get(key)
        if ref:
            ax.axhline(100 * ref["mean"], ls="--", c="k", lw=1, label="oracle-process")
        ax.axhline(0, c="grey", lw=0.8)
        ax.set_xticks(range(len(IMPORTANCES)), list(IMPORTANCES))
        ax.set_title(f"Δ vs GRPO, {title}")
    axes[0].set_ylabel("held-out accuracy, points")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--warm-seeds", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--columns", default=None, help="comma-separated columns to keep (GRPO always): the confirmation")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--bilevel-default", action="store_true",
                    help="read each Bi-Level cell from the default-name runs (the LM lab: oar-g, oracle-oar, ...)")
    args = ap.parse_args()
    columns = [c for c in args.columns.split(",") if c] if args.columns else None
    dirs = finished_runs(args.runs, args.warm_seeds, args.seeds, columns, args.bilevel_default)
    if not any(c == REFERENCE for c, _ in dirs):
        ap.error(f"no finished {REFERENCE} run in {args.runs}")
    d = decompose(dirs)
    text = markdown(d, args.warm_seeds * args.seeds)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write(args.out / "decomposition.json", strict_json(d))
        atomic_write(args.out / "decomposition.md", text)
        plot(d, args.out / "decomposition.png")


if __name__ == "__main__":
    main()
