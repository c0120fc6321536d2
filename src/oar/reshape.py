"""Bi-Level advantage reshaping (OAR_SPEC §4): token importance scores -> per-token weights.

Pure tensor functions over padded ``[B, T]`` batches; every row is reshaped independently over the
positions where its mask is true (the reasoning tokens).
"""

from __future__ import annotations

import torch

from oar.ranges import check_range

# OAR_SPEC §4 defaults (the one home of τ, β and the floor) and their valid ranges (checked here, by OARConfig's
# oar_tau/oar_beta/oar_floor and by every credit method's tau/beta/floor option)
TAU = 0.25
BETA = 1.0
FLOOR = 0.1
TAU_RANGE = "in (0, 1)"
BETA_RANGE = ">= 0"
FLOOR_RANGE = "in [0, 1]"


def _check_args(scores: torch.Tensor, mask: torch.Tensor, tau: float, beta: float, floor: float) -> None:
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        raise ValueError(f"scores must be a [B, T] tensor, got shape {tuple(getattr(scores, 'shape', ()))}")
    if not scores.is_floating_point():
        raise ValueError(f"scores must be floating point, got dtype {scores.dtype}")
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
    if mask.shape != scores.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != scores shape {tuple(scores.shape)}")
    if mask.device != scores.device:
        raise ValueError(f"mask is on {mask.device} but scores are on {scores.device}")
    check_range("tau", tau, TAU_RANGE)
    check_range("beta", beta, BETA_RANGE)
    check_range("floor", floor, FLOOR_RANGE)


def masked_quantile(values: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """Per-row linear-interpolation quantile (numpy's default) over the masked entries.

    Args:
        values: ``[B, T]`` floats. mask: ``[B, T]`` bool. q: level in [0, 1].

    Returns:
        ``[B]`` quantiles; NaN for rows with no masked entry. Padding never shifts a row's quantile.
    """
    n = mask.sum(dim=1)
    ordered = torch.sort(values.masked_fill(~mask, float("inf")), dim=1).values
    h = (n - 1).clamp_min(0).to(values.dtype) * q
    lo = h.floor().long()
    hi = torch.minimum(lo + 1, (n - 1).clamp_min(0))
    x_lo = ordered.gather(1, lo[:, None]).squeeze(1)
    x_hi = ordered.gather(1, hi[:, None]).squeeze(1)
    frac = h - lo.to(values.dtype)
    out = x_lo + frac * (x_hi - x_lo).nan_to_num(nan=0.0)
    return out.masked_fill(n == 0, float("nan"))


def bilevel_weights(
    scores: torch.Tensor,
    mask: torch.Tensor,
    tau: float = TAU,
    beta: float = BETA,
    floor: float = FLOOR,
) -> torch.Tensor:
    """Bi-Level reshaping weights, row by row over the masked (reasoning) tokens.

    ``s = log1p(max(I, 0))``, ``u`` = min-max of ``s`` in the row, ``theta`` = tau-quantile of ``u``;
    tokens with ``u < theta`` get ``max(u / theta, floor)``, the rest ``1 + beta (u - theta) / (1 - theta)``;
    then the row is rescaled so its masked mean is exactly 1 (advantage mass is preserved).

    Args:
        scores: ``[B, T]`` raw importance scores (any non-negative scale; negatives count as 0).
        mask: ``[B, T]`` bool, true on the reasoning tokens to reshape.
        tau: quantile level in (0, 1) splitting suppressed from boosted tokens.
        beta: boost strength, >= 0.
        floor: minimum weight of a suppressed token (before renormalisation), in [0, 1].

    Returns:
        ``[B, T]`` weights, same dtype/device as ``scores``; exactly 1.0 outside ``mask`` and on every
        row with fewer than 2 masked tokens, all-equal masked scores (a spread of ``log1p`` scores below the
        dtype's smallest normal number counts as equal), or any non-finite masked score.
    """
    _check_args(scores, mask, tau, beta, floor)
    if scores.shape[1] == 0:
        return torch.ones_like(scores)
    n = mask.sum(dim=1)
    finite = torch.where(mask, torch.isfinite(scores), True).all(dim=1)

    s = torch.log1p(scores.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0.0))
    s_min = s.masked_fill(~mask, float("inf")).amin(dim=1, keepdim=True)
    s_max = s.masked_fill(~mask, float("-inf")).amax(dim=1, keepdim=True)
    span = s_max - s_min
    # a spread below the smallest normal number is no spread: subnormal ratios are noise (and flushed to 0 on
    # CPUs in flush-to-zero mode; single subnormal differences inside a larger spread may still differ there)
    valid = (n >= 2) & finite & (span.squeeze(1) > torch.finfo(s.dtype).tiny)

    u = ((s - s_min) / torch.where(span > 0, span, torch.ones_like(span))).clamp(0.0, 1.0)
    u = u.masked_fill(~mask, 0.0)
    theta = masked_quantile(u, mask, tau).nan_to_num(nan=0.0)[:, None]

    low = torch.clamp_min(u / torch.where(theta > 0, theta, torch.ones_like(theta)), floor)
    gap = 1.0 - theta
    high = 1.0 + beta * (u - theta) / torch.where(gap > 0, gap, torch.ones_like(gap))
    w = torch.where(u < theta, low, high).masked_fill(~mask, 0.0)

    total = w.sum(dim=1, keepdim=True)
    w = w * n[:, None].to(w.dtype) / torch.where(total > 0, total, torch.ones_like(total))
    keep = valid[:, None] & mask
    return torch.where(keep, w, torch.ones_like(w))


def weight_stats(weights: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Diagnostics of token weights over the masked tokens of a batch (log them every step).

    Args:
        weights: ``[B, T]`` weights from :func:`bilevel_weights`. mask: ``[B, T]`` bool.

    Returns:
        ``mean``, ``std``, ``max``, ``min``; ``frac_suppressed`` (w < 1); ``frac_floor`` (tokens sharing
        their row's lowest weight in a non-uniform row: with ``floor > 0`` these are the floored tokens);
        ``ess_ratio`` = (Σw)² / (n Σw²) in (0, 1]; ``gini`` in [0, 1). All NaN-free; zeros when the mask
        is empty.
    """
    if weights.shape != mask.shape or mask.dtype != torch.bool:
        raise ValueError(f"weights {tuple(weights.shape)} and bool mask {tuple(mask.shape)} must match")
    w = weights[mask].double()
    n = w.numel()
    if n == 0:
        return dict.fromkeys(("mean", "std", "max", "min", "frac_suppressed", "frac_floor", "ess_ratio", "gini"), 0.0)
    row_min = weights.masked_fill(~mask, float("inf")).amin(dim=1, keepdim=True)
    row_max = weights.masked_fill(~mask, float("-inf")).amax(dim=1, keepdim=True)
    at_floor = mask & (row_max > row_min) & torch.isclose(weights, row_min.expand_as(weights), rtol=1e-5, atol=0)
    total = w.sum()
    ordered = torch.sort(w).values
    ranks = torch.arange(1, n + 1, dtype=w.dtype, device=w.device)
    gini = ((2 * ranks - n - 1) * ordered).sum() / (n * total) if total > 0 else torch.zeros(())
    return {
        "mean": w.mean().item(),
        "std": w.std(unbiased=False).item(),
        "max": w.max().item(),
        "min": w.min().item(),
        "frac_suppressed": (w < 1.0).double().mean().item(),
        "frac_floor": at_floor.sum().item() / n,
        "ess_ratio": (total**2 / (n * (w**2).sum())).item() if total > 0 else 0.0,
        "gini": float(gini),
    }
