"""Statistics of a comparison over seeds: Student-t intervals, Welch differences, accuracy between evaluations."""

from __future__ import annotations

import math

import numpy as np

# two-sided 95% Student-t quantiles, by degrees of freedom (normal beyond 30)
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t_quantile(df: int) -> float:
    """Two-sided 95% Student-t quantile for ``df`` degrees of freedom (tabulated, conservative between rows)."""
    if df < 1:
        return float("nan")
    return _T975[min((k for k in _T975 if k >= df), default=30)] if df <= 30 else 1.96


def mean_ci(values: list[float]) -> dict[str, float]:
    """``mean``, sample ``std`` and the 95% CI half-width ``ci95`` (Student t; NaN with one value)."""
    n = len(values)
    mean = sum(values) / n if n else float("nan")
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else float("nan")
    return {"mean": mean, "std": std, "ci95": t_quantile(n - 1) * std / math.sqrt(n) if n > 1 else float("nan"),
            "n": n}


def diff_ci(a: list[float], b: list[float]) -> dict[str, float]:
    """Difference of means ``mean(a) - mean(b)`` with its 95% CI half-width ``ci95`` (Welch's t; NaN if n < 2)."""
    sa, sb = mean_ci(a), mean_ci(b)
    diff = sa["mean"] - sb["mean"]
    if sa["n"] < 2 or sb["n"] < 2:
        return {"mean": diff, "ci95": float("nan"), "n": min(sa["n"], sb["n"])}
    va, vb = sa["std"] ** 2 / sa["n"], sb["std"] ** 2 / sb["n"]
    se = math.sqrt(va + vb)
    den = va**2 / (sa["n"] - 1) + vb**2 / (sb["n"] - 1)
    df = (va + vb) ** 2 / den if den > 0 else sa["n"] + sb["n"] - 2  # Welch–Satterthwaite
    return {"mean": diff, "ci95": t_quantile(int(df)) * se, "n": min(sa["n"], sb["n"])}


def accuracy_at(curve: list[tuple[int, float, float]], at: float, axis: int = 0) -> float:
    """Held-out accuracy of one run at ``at`` along ``axis`` (0: updates, 1: training seconds), linearly
    interpolated between its evaluations; ValueError outside the evaluated range."""
    x, y = [p[axis] for p in curve], [p[2] for p in curve]
    if not x[0] <= at <= x[-1]:
        raise ValueError(f"{('step', 'second')[axis]} {at} is outside the evaluated range {x[0]}..{x[-1]}")
    return float(np.interp(at, x, y))


def _points(curve: list[tuple[int, float, float]], axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, accuracy) of a run's evaluations along ``axis`` (0: updates, 1: training seconds)."""
    return np.array([p[axis] for p in curve], dtype=float), np.array([p[2] for p in curve], dtype=float)


def mean_accuracy_until(curve: list[tuple[int, float, float]], until: float, axis: int = 0) -> float:
    """Normalised area under a run's held-out accuracy from its first evaluation to ``until`` along ``axis``
    (0: updates, 1: training seconds), i.e. the mean accuracy over that range (trapezoids on the curve
    interpolated linearly between evaluations). ValueError when ``until`` lies outside the evaluated range."""
    x, y = _points(curve, axis)
    if not x[0] < until <= x[-1]:
        raise ValueError(f"until={until} is outside the evaluated range ({x[0]}, {x[-1]}]")
    keep = x < until
    xs, ys = np.append(x[keep], until), np.append(y[keep], np.interp(until, x, y))
    return float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2) / (xs[-1] - xs[0]))


def first_reach(curve: list[tuple[int, float, float]], target: float, axis: int = 0) -> float | None:
    """Where along ``axis`` (0: updates, 1: training seconds) a run's held-out accuracy first reaches ``target``,
    interpolated linearly between the two evaluations that straddle it; None if it never does."""
    x, y = _points(curve, axis)
    hits = np.nonzero(y >= target)[0]
    if not hits.size:
        return None
    i = int(hits[0])
    if i == 0:
        return float(x[0])
    return float(x[i - 1] + (target - y[i - 1]) / (y[i] - y[i - 1]) * (x[i] - x[i - 1]))


def ratio_ci(num: dict[int, float], den: dict[int, float], resamples: int = 2000,
             seed: int = 0) -> dict[str, float | None]:
    """``mean(num) / mean(den)`` over the seeds both hold, with a 95% percentile bootstrap interval that resamples
    seeds (paired: one draw picks the same seeds for both). ``num``/``den``: seed -> value. ``mean`` is None when
    the mean denominator is <= 0 (no headroom to share); a bootstrap draw with a denominator <= 0 is dropped and
    ``dropped`` counts them."""
    seeds = sorted(set(num) & set(den))
    a, b = np.array([num[s] for s in seeds]), np.array([den[s] for s in seeds])
    out: dict[str, float | None] = {"mean": None, "lo": None, "hi": None, "n": len(seeds), "dropped": 0}
    if not seeds or b.mean() <= 0:
        return out
    out["mean"] = float(a.mean() / b.mean())
    if len(seeds) > 1:
        idx = np.random.default_rng(seed).integers(0, len(seeds), size=(resamples, len(seeds)))
        da, db = a[idx].mean(axis=1), b[idx].mean(axis=1)
        ok = db > 0
        r = da[ok] / db[ok]
        out.update(lo=float(np.percentile(r, 2.5)), hi=float(np.percentile(r, 97.5)), dropped=int((~ok).sum()))
    return out
