"""``report.md`` for one or more run directories: results table, key figures, summary table, every metric's curve."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from oar.files import atomic_write
from oar.viz.plots import (
    Run,
    expand_run_dirs,
    group_runs,
    load_run,
    metric_keys,
    plot_metric,
    plot_step_time_breakdown,
    slug,
    step_time_breakdown,
)

# columns of the summary table, when present: the final logged value (step_time: the mean over the run)
SUMMARY_KEYS = ("eval/accuracy", "reward", "entropy", "oar/ess_ratio", "step_time")


def _cell(value: object) -> str:
    if isinstance(value, bool) or value is None:
        text = "" if value is None else str(value)
    elif isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, dict) and isinstance(value.get("mean"), (int, float)):
        std = value.get("std")
        text = f"{value['mean']:.4g}" + (f" ± {std:.2g}" if isinstance(std, (int, float)) else "")
    elif isinstance(value, (dict, list)):
        text = json.dumps(value)
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table (``|`` escaped, floats to 4 significant digits)."""
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def results_markdown(results: object) -> str:
    """A results object as Markdown: ``{row: {column: value}}`` or a list of flat dicts becomes a table,
    ``{name: value}`` a two-column table, anything else a JSON block. ``{"mean", "std"}`` cells read m ± s."""
    if isinstance(results, dict) and results and all(isinstance(v, dict) for v in results.values()):
        columns = list(dict.fromkeys(k for v in results.values() for k in v))
        return markdown_table(["", *columns], [[name, *(v.get(c) for c in columns)] for name, v in results.items()])
    if isinstance(results, list) and results and all(isinstance(v, dict) for v in results):
        columns = list(dict.fromkeys(k for v in results for k in v))
        return markdown_table(columns, [[v.get(c) for c in columns] for v in results])
    if isinstance(results, dict) and results and not any(isinstance(v, (dict, list)) for v in results.values()):
        return markdown_table(["", "value"], list(results.items()))
    return "```json\n" + json.dumps(results, indent=1) + "\n```"


def _final(run: Run, key: str) -> float | None:
    _, y = run.series(key)
    if not y.size:
        return None
    return float(y.mean()) if key == "step_time" else float(y[-1])


def _spread(values: list[float]) -> str:
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:.4g}"
    v = np.array(values)
    mean, std = v.mean(), v.std(ddof=1)
    std = std if std > 1e-12 * abs(mean) else 0.0  # equal values: no float dust
    return f"{mean:.4g} ± {std:.2g} ({v.min():.4g}..{v.max():.4g})"


def summary_markdown(runs: Sequence[Run], group_by: str = "credit") -> str:
    """One row per group: final values of :data:`SUMMARY_KEYS` as mean ± std (min..max) over its runs."""
    keys = [k for k in SUMMARY_KEYS if any(_final(r, k) is not None for r in runs)]
    rows = []
    for label, members in group_runs(runs, group_by).items():
        seeds = ", ".join(str(r.seed) for r in members if r.seed is not None)
        cells = [_spread([v for r in members if (v := _final(r, k)) is not None]) for k in keys]
        rows.append([label, len(members), seeds, *cells])
    header = [group_by, "runs", "seeds", *(f"{k} (mean s)" if k == "step_time" else k for k in keys)]
    return markdown_table(header, rows)


def _load_results(runs: Sequence[Run]) -> list[tuple[Path, object]]:
    """``results.md`` (preferred, as written by ``oar compare``) or ``results.json`` next to the run directories."""
    found = []
    for parent in dict.fromkeys(r.path.resolve().parent for r in runs):
        if (parent / "results.md").is_file():
            found.append((parent / "results.md", (parent / "results.md").read_text(encoding="utf-8")))
        elif (parent / "results.json").is_file():
            found.append((parent / "results.json", json.loads((parent / "results.json").read_text(encoding="utf-8"))))
    return found


# the figures a reader wants first: (file name, metric, x axis, heading); None metric: the step-time breakdown
KEY_FIGURES: tuple[tuple[str, str | None, str, str], ...] = (
    ("accuracy_vs_updates.png", "eval/accuracy", "step", "Held-out accuracy against updates"),
    ("accuracy_vs_wall_clock.png", "eval/accuracy", "wall_time", "Held-out accuracy against training seconds"),
    ("step_time_breakdown.png", None, "step", "Step-time breakdown per credit"),
    ("weight_ess.png", "oar/ess_ratio", "step", "Weight ESS ratio (1 = uniform credit, as GRPO)"),
)


def _key_figures(runs: Sequence[Run], keys: list[str], out_dir: Path, group_by: str) -> list[str]:
    """Write the :data:`KEY_FIGURES` the runs have data for into ``out_dir/figures/``; their Markdown lines."""
    lines = []
    for name, key, x, heading in KEY_FIGURES:
        if key is None:
            if not step_time_breakdown(runs, group_by):
                continue
            plot_step_time_breakdown(runs, out_dir / "figures" / name, group_by=group_by)
        elif key in keys:
            plot_metric(runs, key, out_dir / "figures" / name, x=x, group_by=group_by, title=heading)
        else:
            continue
        lines += [f"### {heading}", "", f"![{heading}](figures/{name})", ""]
    return lines


def write_report(
    run_dirs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    results: dict | list | None = None,
    x: str = "step",
    group_by: str = "credit",
    results_md: str | None = None,
) -> Path:
    """Write ``out_dir/report.md``: the results table, the key figures (``out_dir/figures/``: accuracy against
    updates and against training seconds, step-time breakdown, weight ESS), the summary table, then every logged
    metric under "All metrics" (``out_dir/plots/*.png``) and the list of runs.

    Args:
        run_dirs: run directories (``run.json`` + ``metrics.jsonl``), or directories holding them.
        out_dir: where ``report.md``, ``figures/`` and ``plots/`` go (created).
        results: a results object for the results table (rendered by :func:`results_markdown`).
        results_md: the results table as Markdown, used as is (``oar compare`` passes its ``results.md``).
            Default for both: ``results.md``, else ``results.json``, next to the run directories.
        x: ``step`` or ``wall_time`` for the "All metrics" curves. group_by: ``credit`` (band over seeds) or ``run``.

    Returns:
        The path of ``report.md``.
    """
    runs = [load_run(d) for d in expand_run_dirs(run_dirs)]
    if not runs:
        raise ValueError("no run directories given")
    out_dir = Path(out_dir)
    keys = metric_keys(runs)
    groups = group_runs(runs, group_by)
    lines = ["# OAR run report", "",
             f"{len(runs)} runs in {len(groups)} groups ({', '.join(groups)}); curves against {x}; lines are means "
             "over the runs of a group, bands their min..max.", ""]
    if results_md is not None:
        tables = [("", results_md)]
    elif results is not None:
        tables = [("", results_markdown(results))]
    else:
        tables = [(str(p), r if isinstance(r, str) else results_markdown(r)) for p, r in _load_results(runs)]
    if tables:
        lines += ["## Results", ""]
        for source, table in tables:
            lines += ([f"From `{source}`:", ""] if source else []) + [table.rstrip("\n"), ""]
    figures = _key_figures(runs, keys, out_dir, group_by)
    if figures:
        lines += ["## Key figures", "", *figures]
    lines += ["## Summary", "", "Final logged value (step_time: mean over the run); mean ± std (min..max) over runs.",
              "", summary_markdown(runs, group_by), ""]
    lines += ["## All metrics", "", f"Every logged metric against {x}.", ""]
    if not keys:
        lines += ["No metric has two or more logged values yet.", ""]
    for key in keys:
        name = f"{slug(key)}.png"
        plot_metric(runs, key, out_dir / "plots" / name, x=x, group_by=group_by)
        lines += [f"### {key}", "", f"![{key}](plots/{name})", ""]
    lines += ["## Runs", ""]
    rows = []
    for r in runs:
        steps = [s for row in r.rows if isinstance(s := row.get("step"), (int, float))]
        rows.append([r.name, r.credit, r.seed, r.meta.get("model"), int(max(steps)) if steps else None,
                     str(r.path)])
    lines += [markdown_table(["run", "credit", "seed", "model", "last step", "path"], rows), ""]
    return atomic_write(out_dir / "report.md", "\n".join(lines))
