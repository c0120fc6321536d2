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


def accuracy_at(curve: list[tuple[int, float, float]], step: float) -> float:
    """Held-out accuracy of one run after ``step`` updates, linearly interpolated between its evaluations."""
    steps, accs = [s for s, _, _ in curve], [a for _, _, a in curve]
    if not steps[0] <= step <= steps[-1]:
        raise ValueError(f"step {step} is outside the evaluated range {steps[0]}..{steps[-1]}")
    return float(np.interp(step, steps, accs))
