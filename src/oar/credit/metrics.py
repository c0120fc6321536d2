"""The ``oar/*`` metrics of token credit, one schema for every adapter (TRL's trainer, the verl plugin).

Each process sums what it scored (:func:`metric_totals`: named counts and token-weighted weight statistics);
the totals of all processes, gathered by name (:func:`gather_totals`), become the logged values
(:func:`metrics_from_totals`, keys :data:`METRIC_KEYS`, the same keys every step whatever was scored). Each total
is reduced over processes by the rule :data:`TOTALS` declares for it: a sum, or the max / min of the extremes.
Pure torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from oar.reshape import weight_stats

# rows per flag (scored completions), plus "total" rows, "tokens" acted on and the summed |offset|
_COUNT_KEYS = ("total", "scored", "uniform", "no_answer", "too_short", "too_long", "nonfinite", "tokens",
               "offset_abs")
# weight_stats keys, summed token-weighted; logged as "oar/weight_<key>" (ess_ratio and gini keep their name)
_STAT_KEYS = ("mean", "std", "frac_suppressed", "frac_floor", "ess_ratio", "gini")
# every per-process total and how it is reduced over processes
TOTALS: dict[str, str] = {**dict.fromkeys(_COUNT_KEYS, "sum"), **{f"sum_{k}": "sum" for k in _STAT_KEYS},
                          "weight_max": "max", "weight_min": "min"}
_REDUCE: dict[str, Callable[[torch.Tensor], float]] = {
    "sum": lambda t: t.sum().item(), "max": lambda t: t.max().item(), "min": lambda t: t.min().item()}

METRIC_KEYS: tuple[str, ...] = (
    "oar/frac_scored", "oar/frac_uniform", "oar/frac_no_answer", "oar/frac_too_short", "oar/frac_too_long",
    "oar/frac_nonfinite", "oar/tokens", "oar/offset_abs_mean", "oar/weight_mean", "oar/weight_std",
    "oar/weight_max", "oar/weight_min", "oar/weight_frac_suppressed", "oar/weight_frac_floor", "oar/ess_ratio",
    "oar/gini",
)


def metric_totals(weights: torch.Tensor, offsets: torch.Tensor, mask: torch.Tensor,
                  flags: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """One process's totals (keys :data:`TOTALS`): ``weights`` / ``offsets`` / ``mask`` ``[B, T]`` (the tokens
    acted on), ``flags`` ``[B]`` bool per :data:`oar.credit.FLAG_KEYS` (``scored``, ``uniform``, ``nonfinite`` at
    least; a missing flag counts 0). The extremes of a process with no token are ∓inf (the neutral elements)."""
    def rows(key: str) -> float:
        return float(flags[key].sum()) if key in flags else 0.0

    n_tok = float(mask.sum())
    out = {"total": float(flags["scored"].shape[0]), **{k: rows(k) for k in _COUNT_KEYS[1:7]}, "tokens": n_tok,
           "offset_abs": float(offsets[mask].abs().sum())}
    stats = weight_stats(weights, mask) if n_tok else {}
    out.update({f"sum_{k}": n_tok * stats[k] if n_tok else 0.0 for k in _STAT_KEYS})
    out["weight_max"] = stats["max"] if n_tok else -math.inf
    out["weight_min"] = stats["min"] if n_tok else math.inf
    return out


def gather_totals(totals: Mapping[str, float], gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Every process's value of each named total, ``[P]`` per key. ``gather``: concatenates a ``[N]`` tensor over
    the ``P`` processes (e.g. ``accelerator.gather``; None: this process only). Every process passes the same
    keys in the same order."""
    local = torch.tensor([float(v) for v in totals.values()], dtype=torch.float64, device=device)
    g = (gather(local) if gather is not None else local).view(-1, len(totals))
    return dict(zip(totals, g.cpu().unbind(1), strict=True))


def metrics_from_totals(totals: Mapping[str, torch.Tensor | float]) -> dict[str, float]:
    """The logged metrics (keys :data:`METRIC_KEYS`) from the totals of every process (:func:`gather_totals`;
    or one process's :func:`metric_totals`): fractions of the scored rows, token-weighted means of the weight
    statistics, the max / min over processes; the values of uniform weights when nothing was scored."""
    tot = {k: _REDUCE[rule](torch.as_tensor(totals[k], dtype=torch.float64)) for k, rule in TOTALS.items()}
    scored, tokens = tot["scored"], tot["tokens"]
    out = {"oar/frac_scored": scored / max(tot["total"], 1.0)}
    for k in ("uniform", "no_answer", "too_short", "too_long", "nonfinite"):
        out[f"oar/frac_{k}"] = tot[k] / scored if scored else 0.0
    out["oar/tokens"] = tokens
    out["oar/offset_abs_mean"] = tot["offset_abs"] / tokens if tokens else 0.0
    for k in _STAT_KEYS:
        name = f"oar/{k}" if k in ("ess_ratio", "gini") else f"oar/weight_{k}"
        out[name] = tot[f"sum_{k}"] / tokens if tokens else (1.0 if k in ("mean", "ess_ratio") else 0.0)
    out["oar/weight_max"] = tot["weight_max"] if tokens else 1.0
    out["oar/weight_min"] = tot["weight_min"] if tokens else 1.0
    return {k: out[k] for k in METRIC_KEYS}
