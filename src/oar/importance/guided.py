"""G-guided OAR-P (extension, not in the paper): exact perturbation on OAR-G's top tokens, the rest calibrated.

Exact OAR-P costs a suffix forward per reasoning token. Here OAR-G (one forward + one backward to the inputs)
ranks the reasoning of each row; only its top ``ceil(k · n)`` tokens are scored exactly by
:func:`oar.importance.perturbation.perturbation_scores` (same mode, same numbers as scoring every token), and
the other tokens get their OAR-G score mapped onto OAR-P's scale by a per-row map fitted on the exactly scored
tokens (:func:`calibrate`):

- ``"median"`` (default): ``p̂ = s · g``, ``s`` the median of ``p / g`` over the exact tokens (a line through
  the origin, since both scores are 0 for a token that does not matter; the median, because a few tokens
  dominate OAR-P's heavy-tailed sum: the ratio of sums scored the lab's pivotal tokens *below chance*, AUC
  0.48, see docs/importance.md). A rest token can rank above an exact token whose OAR-P is lower than its
  OAR-G predicted.
- ``"below"``: ``p̂ = g / g_k · min p``: the rest is placed under every exact token (trusts OAR-G's top-k to
  hold OAR-P's top-k), keeping OAR-G's order among them.

Both maps are monotone in ``g`` and leave the exact tokens' OAR-P untouched; ``k = 1`` is exact OAR-P.
Cost: one OAR-G pass plus a fraction ``k`` of OAR-P's perturbed copies.
"""

from __future__ import annotations

import math

import torch

from oar.importance.gradient import gradient_scores
from oar.importance.perturbation import perturbation_scores

CALIBRATIONS = ("median", "below")


def top_fraction(scores: torch.Tensor, mask: torch.Tensor, k: float) -> torch.Tensor:
    """``[B, L]`` bool: each row's ``ceil(k · n)`` highest masked ``scores`` (``n`` masked tokens; ties broken
    by position, earliest first). ``k`` in (0, 1]."""
    if not 0.0 < k <= 1.0:
        raise ValueError(f"k must be in (0, 1], got {k!r}")
    n = mask.sum(dim=1, keepdim=True)
    take = torch.ceil(n.double() * k).long()
    order = torch.argsort(scores.float().masked_fill(~mask, float("-inf")), dim=1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(scores.shape[1], device=scores.device)
                                            .expand_as(order).contiguous())
    return mask & (rank < take)


def calibrate(guide: torch.Tensor, exact: torch.Tensor, exact_mask: torch.Tensor, mask: torch.Tensor,
              method: str = "median") -> torch.Tensor:
    """Scores ``[B, L]``: ``exact`` where ``exact_mask``, ``guide`` mapped per row onto ``exact``'s scale on the
    rest of ``mask`` (see the module docstring for ``"median"`` / ``"below"``), 0 outside ``mask``.

    Args:
        guide: ``[B, L]`` non-negative guide scores (OAR-G). exact: ``[B, L]`` exact scores (OAR-P), read on
            ``exact_mask`` only. exact_mask / mask: ``[B, L]`` bool, ``exact_mask ⊆ mask``.
    """
    if method not in CALIBRATIONS:
        raise ValueError(f"unknown calibration {method!r}; valid: {', '.join(CALIBRATIONS)}")
    g = guide.float().masked_fill(~mask, 0.0)
    p = exact.float().masked_fill(~exact_mask, 0.0)
    if method == "median":
        usable = exact_mask & (g > 0)
        ratio = (p / torch.where(usable, g, torch.ones_like(g))).masked_fill(~usable, float("nan"))
        s = ratio.nanmedian(dim=1, keepdim=True).values.nan_to_num(nan=0.0)
        rest = g * s.clamp_min(0.0)
    else:
        p_min = p.masked_fill(~exact_mask, float("inf")).amin(dim=1, keepdim=True)
        g_min = g.masked_fill(~exact_mask, float("inf")).amin(dim=1, keepdim=True)
        ok = torch.isfinite(p_min) & (g_min > 0)
        ratio = torch.where(ok, p_min.clamp_min(0.0) / torch.where(ok, g_min, torch.ones_like(g_min)),
                            torch.zeros_like(g_min))
        rest = g * ratio
    out = torch.where(exact_mask, p, rest)
    return out.masked_fill(~mask, 0.0)


def guided_perturbation_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    reasoning_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    k: float = 0.25,
    mode: str = "last",
    guide_mode: str = "answer_mean",
    noise_std: float = 1e-3,
    calibration: str = "median",
    replace_id: int | None = None,
    chunk_size: int = 16,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """OAR-P estimated from exact perturbation of OAR-G's top ``k`` fraction of each row's reasoning tokens.

    Args:
        model, input_ids, attention_mask, reasoning_mask, answer_mask: as every scorer (``[B, L]`` probes).
        k: fraction of each row's reasoning tokens scored exactly, in (0, 1]; ``k = 1`` is exact OAR-P.
        mode: OAR-P's outcome mode (``"last"``, ``"answer_mean"``, ``"answer_joint"``).
        guide_mode / noise_std / generator: OAR-G's mode, embedding noise and random source.
        calibration: ``"median"`` or ``"below"`` (:func:`calibrate`).
        replace_id / chunk_size: OAR-P's counterfactual token and copies per forward.

    Returns:
        ``[B, L]`` float32 scores on OAR-P's scale, 0 outside the reasoning and on rows without an answer.
    """
    if not (isinstance(k, int | float) and 0.0 < k <= 1.0 and math.isfinite(k)):
        raise ValueError(f"k must be in (0, 1], got {k!r}")
    if calibration not in CALIBRATIONS:
        raise ValueError(f"unknown calibration {calibration!r}; valid: {', '.join(CALIBRATIONS)}")
    guide = gradient_scores(model, input_ids, attention_mask, reasoning_mask, answer_mask, mode=guide_mode,
                            noise_std=noise_std, generator=generator)
    exact_mask = top_fraction(guide, reasoning_mask, k)
    exact = perturbation_scores(model, input_ids, attention_mask, exact_mask, answer_mask, mode=mode,
                                replace_id=replace_id, chunk_size=chunk_size)
    scored = reasoning_mask & answer_mask.any(dim=1, keepdim=True)
    return calibrate(guide, exact, exact_mask, scored, calibration)
