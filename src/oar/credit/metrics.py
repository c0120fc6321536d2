"""The ``oar/*`` metrics of token credit, one schema for every adapter (TRL's trainer, the verl plugin).

Each process sums what it scored (:func:`metric_totals`: counts and token-weighted weight statistics, ``[N]``
float64); the sums of all processes (``[P, N]``) become the logged values (:func:`metrics_from_totals`, keys
:data:`METRIC_KEYS`, the same keys every step whatever was scored). Pure torch.
"""

from __future__ import annotations

import math

import torch

from oar.reshape import weight_stats

# counted per process (rows, except "tokens" and "offset_abs")
_COUNT_KEYS = ("total", "scored", "uniform", "no_answer", "too_short", "nonfinite", "tokens", "offset_abs")
# weight_stats keys, summed token-weighted; logged as "oar/weight_<key>" (ess_ratio and gini keep their name)
_STAT_KEYS = ("mean", "std", "max", "min", "frac_suppressed", "frac_floor", "ess_ratio", "gini")

METRIC_KEYS: tuple[str, ...] = (
    "oar/frac_scored", "oar/frac_uniform", "oar/frac_no_answer", "oar/frac_too_short", "oar/frac_nonfinite",
    "oar/tokens", "oar/offset_abs_mean",
    *(f"oar/{k}" if k in ("ess_ratio", "gini") else f"oar/weight_{k}" for k in _STAT_KEYS),
)


def metric_totals(weights: torch.Tensor, offsets: torch.Tensor, mask: torch.Tensor,
                  flags: dict[str, torch.Tensor]) -> list[float]:
    """One process's additive totals: ``weights`` / ``offsets`` / ``mask`` ``[B, T]`` (the tokens acted on),
    ``flags`` ``[B]`` bool per :data:`oar.credit.FLAG_KEYS` (``scored``, ``uniform``, ``nonfinite`` at least;
    a missing flag counts 0)."""
    def rows(key: str) -> float:
        return float(flags[key].sum()) if key in flags else 0.0

    n_tok = float(mask.sum())
    counts = {"total": float(flags["scored"].shape[0]), "scored": rows("scored"), "uniform": rows("uniform"),
              "no_answer": rows("no_answer"), "too_short": rows("too_short") + rows("too_long"),
              "nonfinite": rows("nonfinite"), "tokens": n_tok, "offset_abs": float(offsets[mask].abs().sum())}
    stats = weight_stats(weights, mask) if n_tok else dict.fromkeys(_STAT_KEYS, 0.0)
    out = [counts[k] for k in _COUNT_KEYS] + [n_tok * stats[k] for k in _STAT_KEYS]
    return out + [stats["max"] if n_tok else -math.inf, stats["min"] if n_tok else math.inf]


def metrics_from_totals(totals: torch.Tensor) -> dict[str, float]:
    """The logged metrics (keys :data:`METRIC_KEYS`) from the ``[P, N]`` totals of ``P`` processes: fractions of
    the scored rows, token-weighted means of the weight statistics, the max / min over processes; the values of
    uniform weights when nothing was scored."""
    g = totals.double().view(-1, len(_COUNT_KEYS) + len(_STAT_KEYS) + 2)
    tot = dict(zip(_COUNT_KEYS, g[:, : len(_COUNT_KEYS)].sum(0).tolist(), strict=True))
    sums = g[:, len(_COUNT_KEYS) : len(_COUNT_KEYS) + len(_STAT_KEYS)].sum(0).tolist()
    scored, tokens = tot["scored"], tot["tokens"]
    out = {"oar/frac_scored": scored / max(tot["total"], 1.0)}
    for k in ("uniform", "no_answer", "too_short", "nonfinite"):
        out[f"oar/frac_{k}"] = tot[k] / scored if scored else 0.0
    out["oar/tokens"] = tokens
    out["oar/offset_abs_mean"] = tot["offset_abs"] / tokens if tokens else 0.0
    for k, s in zip(_STAT_KEYS, sums, strict=True):
        name = f"oar/{k}" if k in ("ess_ratio", "gini") else f"oar/weight_{k}"
        if k == "max":
            out[name] = g[:, -2].max().item() if tokens else 1.0
        elif k == "min":
            out[name] = g[:, -1].min().item() if tokens else 1.0
        else:
            out[name] = s / tokens if tokens else (1.0 if k in ("mean", "ess_ratio") else 0.0)
    return {k: out[k] for k in METRIC_KEYS}
