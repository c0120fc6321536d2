"""Benchmark metrics: greedy accuracy, avg@k and unbiased pass@k, each with a 95% interval."""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct among ``n`` samples: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def wilson_interval(successes: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (sensible at 0/n and n/n, unlike the normal one)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + Z95**2 / n
    centre = (p + Z95**2 / (2 * n)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """95% normal interval of the mean of per-problem scores in [0, 1], clipped to [0, 1]."""
    n = len(values)
    if n < 2:
        return (0.0, 1.0)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = Z95 * sd / math.sqrt(n)
    return (max(0.0, mean - half), min(1.0, mean + half))


def summarize_benchmark(correct: Sequence[Sequence[bool]]) -> dict[str, dict[str, float | list[float]]]:
    """Metrics of one benchmark from ``correct[problem][sample]`` (the same number of samples per problem).

    One sample: ``accuracy`` with a Wilson interval. n samples: ``avg@n`` (mean correctness) and the
    unbiased ``pass@k`` for k = 1, 2, 4, ... and n, with normal intervals over problems.
    Each metric: ``{"mean": m, "ci95": [lo, hi]}``. Only ``True`` counts as correct (not ``"yes"``, ``1``, ...).
    """
    if not correct:
        raise ValueError("no graded problems to summarize")
    n = len(correct[0])
    if n == 0 or any(len(row) != n for row in correct):
        raise ValueError("every problem needs the same (non-zero) number of samples")
    if n == 1:
        hits = sum(row[0] is True for row in correct)
        return {"accuracy": {"mean": hits / len(correct), "ci95": list(wilson_interval(hits, len(correct)))}}
    counts = [sum(ok is True for ok in row) for row in correct]
    out: dict[str, dict[str, float | list[float]]] = {}
    ks = sorted({k for k in (2**i for i in range(n.bit_length())) if k <= n} | {n})
    for name, scores in [(f"avg@{n}", [c / n for c in counts])] + [
        (f"pass@{k}", [pass_at_k(n, c, k) for c in counts]) for k in ks
    ]:
        out[name] = {"mean": sum(scores) / len(scores), "ci95": list(mean_interval(scores))}
    return out
