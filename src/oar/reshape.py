"""Reshaping rules: token importance scores -> per-token weights on the sequence advantage (``Â = A · w``).

The one home of every rule an importance credit can take (its ``rule`` option, :data:`RULES`): ``bilevel``
(OAR_SPEC §4, the default), ``sign`` (TASPO's sign-aware redistribution), ``process`` (process supervision's
first-error form, localised by the importance) and ``step`` (Bi-Level over steps). Pure tensor functions over padded
``[B, T]`` batches; every row is reshaped independently over the positions where its mask is true (the reasoning
tokens). The steps a rule groups by come from :mod:`oar.steps`.
"""

from __future__ import annotations

from typing import NamedTuple

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

# the sign rule's temperature, strength and bound (TASPO, arXiv 2608.31077: q = tanh(sign(A)·d̂/τ),
# w = 1 + η(q − q̄), w in [1 − ε, 1 + ε]). The paper's own values could not be read here: these are ours
# (docs/importance.md, "Reshaping rules").
SIGN_TAU = 1.0
SIGN_ETA = 1.0
SIGN_EPS = 0.5
SIGN_TAU_RANGE = "> 0"
SIGN_ETA_RANGE = ">= 0"
SIGN_EPS_RANGE = "in (0, 1]"


class Rule(NamedTuple):
    """One reshaping rule as ``oar credits`` lists it: the weights it gives, whether it keeps the advantage mass
    (masked mean 1), the options it reads and where it comes from."""

    weights: str
    mass: str
    options: str
    source: str


TASPO = "TASPO, arXiv 2608.31077"
RULES: dict[str, Rule] = {
    "bilevel": Rule("OAR's Bi-Level weights of the importance: suppress below the tau-quantile, boost above",
                    "kept (masked mean 1)", "tau, beta, floor", "OAR_SPEC §4 (OAR, arXiv 2601.07408)"),
    "sign": Rule("q = tanh(sign(A)·d̂/sign_tau) with d̂ the row's min-max of log(1 + I), w = 1 + sign_eta·(q − q̄), "
                 "the row's deviation shrunk to stay in [1 − sign_eps, 1 + sign_eps]",
                 "kept (masked mean 1)", "sign_tau, sign_eta, sign_eps", f"{TASPO} (sign-aware redistribution)"),
    "process": Rule("failed rows (A < 0): 0 before the decisive step (the step holding the row's most important "
                    "token), 1 from its first important token on; other rows 1",
                    "not kept (like process supervision)", "separator, boundary_ids",
                    "process supervision's first-error form (arXiv 2305.20050), localised by the importance"),
    "step": Rule("importance summed per step, Bi-Level weights over the row's steps, every token its step's weight",
                 "kept (masked mean 1)", "tau, beta, floor, separator, boundary_ids",
                 f"{TASPO} (action-level aggregation) on OAR_SPEC §4"),
}


def _check_args(scores: torch.Tensor, mask: torch.Tensor, tau: float, beta: float, floor: float) -> None:
    _check_tensors(scores, mask)
    check_range("tau", tau, TAU_RANGE)
    check_range("beta", beta, BETA_RANGE)
    check_range("floor", floor, FLOOR_RANGE)


def _check_tensors(scores: torch.Tensor, mask: torch.Tensor) -> None:
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


def _check_row_tensor(name: str, value: torch.Tensor | None, scores: torch.Tensor, rule: str, shape: tuple) -> None:
    """A per-row (``[B]``) or per-token (``[B, T]``) input a rule reads: there, of the right shape and device."""
    if value is None:
        raise ValueError(f"rule {rule!r} needs {name} (CreditBatch.advantages for the advantages; the steps from "
                         f"oar.steps.step_ids)")
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
        raise ValueError(f"rule {rule!r}: {name} must be a tensor of shape {shape}, "
                         f"got {tuple(getattr(value, 'shape', ()))}")
    if value.device != scores.device:
        raise ValueError(f"rule {rule!r}: {name} is on {value.device} but scores are on {scores.device}")


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


def _unit_importance(scores: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's importance on one scale: ``u`` ``[B, T]`` = min-max of ``log1p(max(I, 0))`` over the row's masked
    tokens (0 elsewhere), the masked count ``n`` ``[B]``, and ``valid`` ``[B]``: at least 2 masked tokens, all finite,
    and a spread (one below the dtype's smallest normal number is none). Bi-Level's ``u`` and the sign rule's ``d̂``."""
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
    return u.masked_fill(~mask, 0.0), n, valid


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
    u, n, valid = _unit_importance(scores, mask)
    theta = masked_quantile(u, mask, tau).nan_to_num(nan=0.0)[:, None]

    low = torch.clamp_min(u / torch.where(theta > 0, theta, torch.ones_like(theta)), floor)
    gap = 1.0 - theta
    high = 1.0 + beta * (u - theta) / torch.where(gap > 0, gap, torch.ones_like(gap))
    w = torch.where(u < theta, low, high).masked_fill(~mask, 0.0)

    total = w.sum(dim=1, keepdim=True)
    w = w * n[:, None].to(w.dtype) / torch.where(total > 0, total, torch.ones_like(total))
    keep = valid[:, None] & mask
    return torch.where(keep, w, torch.ones_like(w))


def sign_weights(
    scores: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    tau: float = SIGN_TAU,
    eta: float = SIGN_ETA,
    eps: float = SIGN_EPS,
) -> torch.Tensor:
    """TASPO's sign-aware redistribution (arXiv 2608.31077), row by row over the masked tokens.

    ``d̂`` = the row's min-max of ``log1p(max(I, 0))`` (Bi-Level's ``u``: one scale for every importance source),
    ``q = tanh(sign(A) · d̂ / tau)``, ``w = 1 + c (q − q̄)`` with ``q̄`` the row's masked mean of ``q`` and
    ``c = min(eta, eps / max|q − q̄|)``: where ``eta`` would take a weight out of ``[1 − eps, 1 + eps]`` the row's
    deviation is shrunk (not clipped), so every weight is in the bound and the masked mean is exactly 1. A failed
    completion (``A < 0``) thus gets *less* weight on the tokens its importance ranks high, a successful one more.

    Args:
        scores: ``[B, T]`` raw importance. mask: ``[B, T]`` bool. advantages: ``[B]`` sequence advantages (only
            their sign is read). tau > 0, eta >= 0, eps in (0, 1].

    Returns:
        ``[B, T]`` weights in ``[1 − eps, 1 + eps]``; exactly 1 outside ``mask`` and on rows with ``A = 0``, fewer
        than 2 masked tokens, all-equal scores or a non-finite masked score.
    """
    _check_tensors(scores, mask)
    _check_row_tensor("advantages", advantages, scores, "sign", (scores.shape[0],))
    check_range("sign_tau", tau, SIGN_TAU_RANGE)
    check_range("sign_eta", eta, SIGN_ETA_RANGE)
    check_range("sign_eps", eps, SIGN_EPS_RANGE)
    if scores.shape[1] == 0:
        return torch.ones_like(scores)
    u, n, valid = _unit_importance(scores, mask)
    sign = torch.sign(advantages).to(u.dtype)[:, None]
    q = torch.tanh(sign * u / tau)
    q_bar = torch.where(mask, q, 0.0).sum(dim=1, keepdim=True) / n.clamp_min(1)[:, None].to(u.dtype)
    dev = torch.where(mask, q - q_bar, 0.0)
    peak = dev.abs().amax(dim=1, keepdim=True)
    gain = torch.minimum(torch.full_like(peak, eta), eps / torch.where(peak > 0, peak, torch.ones_like(peak)))
    keep = (valid & (advantages != 0))[:, None] & mask
    return torch.where(keep, 1.0 + gain * dev, torch.ones_like(u))


def process_weights(scores: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor,
                    steps: torch.Tensor) -> torch.Tensor:
    """Process supervision's first-error form with the first error localised by the importance, per row.

    On a failed completion (``A < 0``) the *decisive step* is the step holding the row's most important token
    (``max(I, 0)``; the first such token when several tie); every masked token before that step's first token of
    positive importance gets weight 0, every one from it on 1 (mass not preserved, as process supervision).
    Successful completions keep weight 1: process supervision marks every step of a correct solution correct, and
    the rule then acts only where the first error is to be found. With the lab's perfect blame importance (1 from the
    first wrong step on) this is exactly process supervision (``oracle-process``).

    Args:
        scores: ``[B, T]`` raw importance. mask: ``[B, T]`` bool. advantages: ``[B]``. steps: ``[B, T]`` long, the
            step of every masked token (:func:`oar.steps.step_ids`).

    Returns:
        ``[B, T]`` weights in {0, 1}; exactly 1 outside ``mask`` and on rows with ``A >= 0``, all-equal scores or a
        non-finite masked score.
    """
    _check_tensors(scores, mask)
    _check_row_tensor("advantages", advantages, scores, "process", (scores.shape[0],))
    _check_row_tensor("steps", steps, scores, "process", tuple(scores.shape))
    B, T = scores.shape
    if T == 0:
        return torch.ones_like(scores)
    finite = torch.where(mask, torch.isfinite(scores), True).all(dim=1, keepdim=True)
    imp = torch.where(mask, scores.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0.0), 0.0)
    top = imp.masked_fill(~mask, float("-inf")).amax(dim=1, keepdim=True)
    spread = top > imp.masked_fill(~mask, float("inf")).amin(dim=1, keepdim=True)
    col = torch.arange(T, device=scores.device)[None, :]
    first_top = torch.where(mask & (imp == top), col, T).amin(dim=1, keepdim=True).clamp_max(T - 1)
    decisive = steps.gather(1, first_top)
    start = torch.where(mask & (steps == decisive) & (imp > 0), col, T).amin(dim=1, keepdim=True)
    act = (advantages < 0)[:, None] & finite & spread & mask
    return torch.where(act, (col >= start).to(scores.dtype), torch.ones_like(scores))


def step_weights(scores: torch.Tensor, mask: torch.Tensor, steps: torch.Tensor, tau: float = TAU,
                 beta: float = BETA, floor: float = FLOOR) -> torch.Tensor:
    """Step-level Bi-Level reshaping: each step's importance is the sum over its masked tokens, the row's steps are
    reshaped by :func:`bilevel_weights` (a step is one unit: the ``tau``-quantile splits steps), every token gets its
    step's weight, and the row is rescaled so its masked token mean is exactly 1 (advantage mass preserved).

    Args:
        scores: ``[B, T]`` raw importance. mask: ``[B, T]`` bool. steps: ``[B, T]`` long, the step of every masked
            token (:func:`oar.steps.step_ids`). tau / beta / floor: as for :func:`bilevel_weights`.

    Returns:
        ``[B, T]`` weights, constant within each step; exactly 1 outside ``mask`` and on rows with fewer than 2
        steps, all-equal step sums or a non-finite masked score.
    """
    _check_args(scores, mask, tau, beta, floor)
    _check_row_tensor("steps", steps, scores, "step", tuple(scores.shape))
    if not mask.any():
        return torch.ones_like(scores)
    idx = torch.where(mask, steps, 0)
    if int(idx.min()) < 0:
        raise ValueError("rule 'step': steps must be >= 0 on every masked token")
    S = int(idx.max()) + 1
    step_scores = torch.zeros(scores.shape[0], S, dtype=scores.dtype, device=scores.device)
    step_scores.scatter_add_(1, idx, torch.where(mask, scores, 0.0))
    count = torch.zeros(scores.shape[0], S, dtype=torch.long, device=scores.device)
    count.scatter_add_(1, idx, mask.long())
    w = bilevel_weights(step_scores, count > 0, tau, beta, floor).gather(1, idx).masked_fill(~mask, 0.0)
    n = mask.sum(dim=1, keepdim=True).to(w.dtype)
    total = w.sum(dim=1, keepdim=True)
    w = w * n / torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(mask, w, torch.ones_like(w))


def rule_weights(rule: str, scores: torch.Tensor, mask: torch.Tensor, *, advantages: torch.Tensor | None = None,
                 steps: torch.Tensor | None = None, tau: float = TAU, beta: float = BETA, floor: float = FLOOR,
                 sign_tau: float = SIGN_TAU, sign_eta: float = SIGN_ETA, sign_eps: float = SIGN_EPS) -> torch.Tensor:
    """The weights of ``rule`` (one of :data:`RULES`) on ``scores`` / ``mask`` ``[B, T]``: ``advantages`` ``[B]``
    for ``sign`` and ``process``, ``steps`` ``[B, T]`` for ``process`` and ``step``; each rule reads only its own
    parameters. ValueError naming an unknown rule or a missing input."""
    if rule == "bilevel":
        return bilevel_weights(scores, mask, tau, beta, floor)
    if rule == "sign":
        return sign_weights(scores, mask, advantages, sign_tau, sign_eta, sign_eps)
    if rule == "process":
        return process_weights(scores, mask, advantages, steps)
    if rule == "step":
        return step_weights(scores, mask, steps, tau, beta, floor)
    raise ValueError(f"rule must be one of {', '.join(map(repr, RULES))}, got {rule!r}")


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
