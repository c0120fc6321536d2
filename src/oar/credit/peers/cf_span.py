"""CF-GRPO: span-level counterfactual credit (Khandoga et al., "Beyond Uniform Credit: Causal Credit Assignment
for Policy Optimization", arXiv 2602.09331), as re-implemented by SCAPO (≤ 10 spans of 5–50 tokens, weights
clipped to [0.5, 4]).

Each probed span of the reasoning is replaced by pad tokens (OAR-P's engine, ``span=`` windows, teacher-forced
answer probability: mode ``answer_joint``); its drop in answer probability Δ_s = p - p_s sets the weight of its
tokens ``w = clip(1 + Δ_s / mean_s' |Δ_s'|, 0.5, 4)``, 1 for tokens in no probed span; ``Â = A · w``.
Our reading where the paper is not public (docs/credits.md): spans are equal-width windows of the reasoning
(width ``clamp(ceil(L / 10), 5, 50)``; above 500 tokens 10 evenly spaced windows are probed), not
sentence/equation boundaries; p is exp(mean answer-token log-prob); every scored completion is probed against
its own answer; no mass renormalisation unless ``renormalize=True``.
"""

from __future__ import annotations

import torch

from oar.importance import perturbation_scores


def cf_spans(mask: torch.Tensor, max_spans: int = 10, min_len: int = 5, max_len: int = 50) -> torch.Tensor:
    """``[B, L]`` long: the probed span of each masked token (equal-width windows of the row's masked run), -1 for
    tokens in no probed span or off the mask."""
    rank = mask.long().cumsum(dim=1) - 1
    n_tok = mask.sum(dim=1, keepdim=True)
    width = (n_tok + max_spans - 1).div(max_spans, rounding_mode="floor").clamp(min_len, max_len)
    seg = rank.div(width, rounding_mode="floor")
    n_seg = (n_tok + width - 1).div(width, rounding_mode="floor")
    step = (n_seg - 1).clamp_min(1).double() / (max_spans - 1)  # > 1 only when there are too many windows
    j = torch.floor(seg.double() / step + 0.5)
    chosen = (n_seg <= max_spans) | (torch.floor(j * step + 0.5) == seg.double())
    return torch.where(mask & chosen, seg, -1)


def cf_span_weights(drop: torch.Tensor, mask: torch.Tensor, low: float = 0.5, high: float = 4.0,
                    renormalize: bool = False) -> torch.Tensor:
    """``[B, T]`` CF-GRPO weights from the log-probability drop ``drop = φ - φ_s`` of each token's span.

    Δ_s = p(1 - exp(-drop)) is the probability drop; the row's p cancels in ``Δ_s / mean |Δ_s'|`` (the mean over
    the probed spans). Tokens in no probed span get 1; ``renormalize`` rescales each row to mean weight 1 on
    ``mask``.
    """
    spans = cf_spans(mask)
    probed = spans >= 0
    delta = torch.where(probed, -torch.expm1(-drop.double()), torch.zeros_like(drop, dtype=torch.float64))
    # mean over spans of |Δ_s|: token-level mean weighted by 1 / span length
    B, T = mask.shape
    length = torch.zeros(B, T + 1, dtype=torch.float64, device=mask.device)
    length.scatter_add_(1, spans.clamp_min(0), probed.double())
    per_token_len = length.gather(1, spans.clamp_min(0)).clamp_min(1)
    counted = probed.double() / per_token_len
    spans_probed = counted.sum(dim=1, keepdim=True)
    scale = (delta.abs() * counted).sum(dim=1, keepdim=True) / spans_probed.clamp_min(1)
    w = torch.where(scale > 0, 1 + delta / torch.where(scale > 0, scale, torch.ones_like(scale)),
                    torch.ones_like(delta)).clamp(low, high)
    w = torch.where(probed, w, torch.ones_like(w))
    if renormalize:
        mean = (w * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp_min(1)
        w = w / mean
    return torch.where(mask, w, torch.ones_like(w)).float()


def cf_span_scores(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   reasoning_mask: torch.Tensor, answer_mask: torch.Tensor, chunk_size: int = 16) -> torch.Tensor:
    """``[B, L]`` φ - φ_s (mean answer-token log-prob drop) of each reasoning token's probed span, 0 elsewhere."""
    spans = cf_spans(reasoning_mask)
    return perturbation_scores(model, input_ids, attention_mask, reasoning_mask & (spans >= 0), answer_mask,
                               mode="answer_joint", chunk_size=chunk_size, span=spans.clamp_min(0))
