"""Learning curves of run directories (:mod:`oar.rundir`: ``run.json`` + ``metrics.jsonl``) with matplotlib (Agg
backend).

Runs are grouped by credit method: one mean line per group, with a min-max band over its seeds.
"""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from oar.files import atomic_write
from oar.rundir import METRICS_JSONL, RunDir

# plotted first, in this order, when present; every other numeric metric with >= 2 points follows
PREFERRED = ("eval/accuracy", "reward", "entropy", "oar/ess_ratio", "step_time", "oar/weight_std",
             "oar/importance_share", "loss", "grad_norm")
_NOT_METRICS = {"step", "wall_time", "epoch"}


def save_png(fig, path: str | os.PathLike, **savefig_kwargs) -> Path:
    """Write matplotlib figure ``fig`` as a PNG at ``path`` atomically and close it; returns the path."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", **savefig_kwargs)
    finally:
        plt.close(fig)
    return atomic_write(path, buf.getvalue())


@dataclass
class Run:
    """One run directory: its ``run.json`` (``meta``) and its ``metrics.jsonl`` rows in file order."""

    path: Path
    meta: dict
    rows: list[dict] = field(default_factory=list)

    @property
    def credit(self) -> str:
        """The run's credit as one value (``oar-p@horizon=2``), as ``run.json`` records it; a run of an older oar
        recorded the options apart (``config.credit_options``), joined back here, so runs of one method under
        other options form their own group."""
        from oar.credit.spec import CreditSpec  # pure Python: a report needs no torch

        name = str(self.meta.get("credit", self.path.name))
        options = (self.meta.get("config") or {}).get("credit_options")
        if not options:
            return name
        return str(CreditSpec.parse(name).merged(options, "config.credit_options"))

    @property
    def seed(self) -> int | None:
        return self.meta.get("seed")

    @property
    def name(self) -> str:
        return self.path.name

    def series(self, key: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` of a metric sorted by ``x`` (``step`` or ``wall_time``, the latter from the run's first
        row); the last row wins on a repeated ``x``. ``step_time`` falls back to Δwall_time / Δstep."""
        if key == "step_time" and not any(_is_number(r.get(key)) for r in self.rows):
            return self._derived_step_time(x)
        points: dict[float, float] = {}
        for r in self.rows:
            if _is_number(r.get(key)) and _is_number(r.get(x)):
                points[float(r[x])] = float(r[key])
        xs = np.array(sorted(points), dtype=float)
        ys = np.array([points[v] for v in xs], dtype=float)
        if x == "wall_time" and xs.size:
            xs = xs - min(float(r["wall_time"]) for r in self.rows if _is_number(r.get("wall_time")))
        return xs, ys

    def _derived_step_time(self, x: str) -> tuple[np.ndarray, np.ndarray]:
        steps, walls = self.series("wall_time", "step")
        keep = np.diff(steps) > 0
        dt = np.diff(walls)[keep] / np.diff(steps)[keep]
        if x == "step":
            return steps[1:][keep], dt
        return walls[1:][keep] - (walls[0] if walls.size else 0.0), dt


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_run_dir(path: Path) -> bool:
    return RunDir(path).is_run()


def expand_run_dirs(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Run directories among ``paths``; a directory that is not a run stands for its sub-directories that
    are (e.g. the output directory of ``oar compare``). Errors name the offending path."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise FileNotFoundError(f"run directory not found: {p}")
        found = [p] if is_run_dir(p) else sorted(c for c in p.iterdir() if c.is_dir() and is_run_dir(c))
        if not found:
            raise FileNotFoundError(f"{p} has no {METRICS_JSONL} (nor sub-directories with one)")
        out.extend(found)
    return out


def load_run(run_dir: str | os.PathLike) -> Run:
    """Read ``run.json`` (optional) and ``metrics.jsonl`` (:class:`oar.rundir.RunDir`); a bad line raises
    ``ValueError`` naming it (a half-written last line, from a run still writing, is skipped)."""
    run = RunDir(run_dir)
    rows = run.metrics()  # FileNotFoundError first: a directory without metrics is no run
    return Run(run.path, run.meta(), rows)


def metric_keys(runs: Sequence[Run]) -> list[str]:
    """Metrics worth a curve: numeric in at least 2 rows of some run (``step_time`` also when derivable)."""
    counts: dict[str, int] = {}
    for run in runs:
        for key in {k for r in run.rows for k in r} - _NOT_METRICS:
            counts[key] = max(counts.get(key, 0), sum(_is_number(r.get(key)) for r in run.rows))
    keys = {k for k, n in counts.items() if n >= 2}
    if any(run.series("step_time")[0].size >= 2 for run in runs):
        keys.add("step_time")
    return [k for k in PREFERRED if k in keys] + sorted(keys - set(PREFERRED))


def group_runs(runs: Sequence[Run], by: str = "credit") -> dict[str, list[Run]]:
    """Runs by credit method (``by="credit"``) or one group per run (``by="run"``), sorted by label."""
    if by not in ("credit", "run"):
        raise ValueError(f"group_by must be 'credit' or 'run', got {by!r}")
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.credit if by == "credit" else run.name, []).append(run)
    return dict(sorted(groups.items()))


def band(series: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x, mean, min, max)`` over several ``(x, y)`` series, each interpolated linearly onto the union of
    their x values inside the range every series covers."""
    series = [(x, y) for x, y in series if x.size]
    if not series:
        empty = np.zeros(0)
        return empty, empty, empty, empty
    if len(series) == 1:
        x, y = series[0]
        return x, y, y, y
    lo, hi = max(x[0] for x, _ in series), min(x[-1] for x, _ in series)
    grid = np.unique(np.concatenate([x[(x >= lo) & (x <= hi)] for x, _ in series]))
    ys = np.stack([np.interp(grid, x, y) for x, y in series])
    return grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def slug(key: str) -> str:
    """A file-name-safe version of a metric name (``eval/accuracy`` -> ``eval_accuracy``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("_") or "metric"


def plot_metric(runs: Sequence[Run], key: str, path: str | os.PathLike, x: str = "step",
                group_by: str = "credit", title: str | None = None) -> Path:
    """One PNG: ``key`` against ``x`` (``step`` or ``wall_time``), a line per group and a min-max band over
    the runs of a group; ``title`` defaults to ``key``. Written atomically; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if x not in ("step", "wall_time"):
        raise ValueError(f"x must be 'step' or 'wall_time', got {x!r}")
    groups = group_runs(runs, group_by)
    many = len(groups) > 10  # tab20 and the legend beside the axes, so every group keeps its own colour
    colours = plt.get_cmap("tab20" if many else "tab10")
    fig, ax = plt.subplots(figsize=(9.6 if many else 6.4, 4.0), dpi=110)
    try:
        for i, (label, members) in enumerate(groups.items()):
            gx, mean, lo, hi = band([r.series(key, x) for r in members])
            if not gx.size:
                continue
            colour = colours(i % colours.N)
            n = len(members)
            ax.plot(gx, mean, color=colour, lw=1.6, marker="o" if gx.size < 3 else None,
                    ls="--" if many and i % 2 else "-", label=f"{label} (mean of {n})" if n > 1 else label)
            if n > 1:
                ax.fill_between(gx, lo, hi, color=colour, alpha=0.2 if len(groups) <= 4 else 0.06, lw=0)
        ax.set_xlabel("training step" if x == "step" else "wall_time: seconds since the first logged row")
        ax.set_ylabel(key)
        derived = key == "step_time" and not any(_is_number(r.get(key)) for run in runs for r in run.rows)
        ax.set_title((title or key) + (" (Δ wall_time / Δ step)" if derived else ""))
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small", **({"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)} if many else {}))
    except BaseException:
        plt.close(fig)
        raise
    return save_png(fig, path, bbox_inches="tight")  # keeps the legend below the axes


def step_time_breakdown(runs: Sequence[Run], group_by: str = "credit") -> dict[str, tuple[float, float]]:
    """Per group, ``(scoring, rest)`` seconds per training step, means over its runs: ``step_time`` (or
    Δwall_time / Δstep) split by ``oar/importance_share`` (0 when not logged, as for GRPO)."""
    out = {}
    for label, members in group_runs(runs, group_by).items():
        totals, shares = [], []
        for run in members:
            _, dt = run.series("step_time")
            _, share = run.series("oar/importance_share")
            if dt.size:
                totals.append(float(dt.mean()))
                shares.append(float(share.mean()) if share.size else 0.0)
        if totals:
            total, share = float(np.mean(totals)), float(np.mean(shares))
            out[label] = (total * share, total * (1.0 - share))
    return out


def plot_step_time_breakdown(runs: Sequence[Run], path: str | os.PathLike, group_by: str = "credit") -> Path:
    """One PNG: a horizontal bar per group, seconds per step split into token scoring and the rest
    (generation, loss, update), from :func:`step_time_breakdown`. Written atomically; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = step_time_breakdown(runs, group_by)
    labels = list(parts)
    fig, ax = plt.subplots(figsize=(6.4, 1.2 + 0.45 * max(len(labels), 1)), dpi=110)
    try:
        scoring = [parts[k][0] for k in labels]
        rest = [parts[k][1] for k in labels]
        ax.barh(labels, rest, color="#9aa5b1", label="generation, loss and update")
        ax.barh(labels, scoring, left=rest, color="#d9534f", label="token scoring (OAR)")
        for i, (s, r) in enumerate(zip(scoring, rest, strict=True)):
            ax.text(s + r, i, f" {s + r:.2f} s" + (f" ({100 * s / (s + r):.0f}% scoring)" if s >= 0.005 * (s + r)
                                                   else ""),
                    va="center", fontsize="small")
        ax.invert_yaxis()
        ax.set_xlabel("seconds per training step (mean over runs)")
        ax.set_title("step-time breakdown")
        ax.set_xlim(0, max((s + r for s, r in zip(scoring, rest, strict=True)), default=1.0) * 1.45)
        ax.grid(alpha=0.3, axis="x")
        if labels:
            ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=2, frameon=False)
        fig.tight_layout()
    except BaseException:
        plt.close(fig)
        raise
    return save_png(fig, path)
