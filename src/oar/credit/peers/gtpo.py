"""GTPO: entropy-shaped token rewards (Tan et al., "GTPO and GRPO-S: Token and Sequence-Level Reward Shaping
with Policy Entropy", arXiv 2508.04349).

Per group and completion position t, with O+ the successful and O- the failed completions alive at t (d_t, h_t
of them) and H the policy's entropy:

    r⁺_{i,t} = α1 + α2 · H_{i,t} / Σ_{k∈O+} H_{k,t} · d_t
    r⁻_{j,t} = -α1 - α2 · (1/H_{j,t}) / Σ_{k∈O-} (1/H_{k,t}) · h_t

then z-scored into token advantages (population std), over all tokens of the group (``norm="joint"``, default)
or separately over the O+ and the O- tokens (``norm="separate"``). The token advantages *replace* GRPO's.
Choices the paper leaves open (docs/credits.md): success = reward > 0; groups without both outcomes keep
GRPO's advantage (0 for binary rewards); ``eps`` in 1/H and the std; the default norm (the separate reading
makes each class mean 0, so half the tokens of a correct answer get a negative advantage).
"""

from __future__ import annotations

import torch

from oar.credit.batch import CreditBatch
from oar.credit.peers._entropy import completion_entropy

NORMS = ("joint", "separate")  # GTPO's normalisation: one z-score of the token rewards, or one per outcome


def gtpo_advantages(entropy: torch.Tensor, mask: torch.Tensor, success: torch.Tensor, group: torch.Tensor,
                    alpha1: float = 1.0, alpha2: float = 0.1, norm: str = "joint", eps: float = 1e-6) -> torch.Tensor:
    """``[B, T]`` GTPO token advantages (0 off ``mask``).

    Args:
        entropy: ``[B, T]`` policy entropy per token (nats). mask: ``[B, T]`` bool, the tokens that count (a
            completion is alive at t while its mask is true). success: ``[B]`` bool. group: ``[B]`` long ids.
        alpha1 / alpha2: outcome and entropy-share coefficients. norm: ``"joint"`` or ``"separate"``.
        eps: added to H before inverting and to the std.
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be 'joint' or 'separate', got {norm!r}")
    m = mask.float()
    H = entropy.float() * m
    inv = torch.where(mask, 1.0 / (H + eps), torch.zeros_like(H))
    _, g = torch.unique(group, return_inverse=True)  # [B] dense group index
    n_groups = int(g.max()) + 1 if g.numel() else 0
    pos, neg = (success[:, None] & mask).float(), (~success[:, None] & mask).float()

    def per_group_sum(x: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T]: sum over the row's group
        out = torch.zeros(n_groups, x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, g, x)
        return out[g]

    d, h = per_group_sum(pos), per_group_sum(neg)
    share_pos = H * pos / per_group_sum(H * pos).clamp_min(eps)
    share_neg = inv * neg / per_group_sum(inv * neg).clamp_min(eps)
    reward = torch.where(success[:, None], alpha1 + alpha2 * share_pos * d, -alpha1 - alpha2 * share_neg * h) * m

    def zscore(x: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:  # per group, over the selected tokens
        n = per_group_sum(sel).sum(dim=1, keepdim=True)  # every row of a group holds the group's count
        mean = per_group_sum(x * sel).sum(dim=1, keepdim=True) / n.clamp_min(1)
        var = per_group_sum((x - mean).square() * sel).sum(dim=1, keepdim=True) / n.clamp_min(1)
        return (x - mean) / (var.sqrt() + eps) * sel

    if norm == "joint":
        return zscore(reward, m)
    return zscore(reward, pos) + zscore(reward, neg)


def gtpo_effect(scores: torch.Tensor, mask: torch.Tensor, batch: CreditBatch, alpha1: float = 1.0,
                alpha2: float = 0.1, norm: str = "joint") -> torch.Tensor:
    """``[B, T]`` GTPO token advantages of the entropies ``scores`` in groups with both a success and a failure
    (0 elsewhere)."""
    both = _groups_with_both_outcomes(batch)
    keep = mask & both[:, None]
    return gtpo_advantages(scores, keep, batch.rewards > 0, batch.group, alpha1, alpha2, norm)


def _groups_with_both_outcomes(batch: CreditBatch) -> torch.Tensor:
    """``[B]`` bool: the row's group has at least one success (reward > 0) and one failure."""
    success = (batch.rewards > 0).float()
    _, g = torch.unique(batch.group, return_inverse=True)
    n = torch.zeros(int(g.max()) + 1, device=g.device).index_add_(0, g, torch.ones_like(success))
    wins = torch.zeros_like(n).index_add_(0, g, success)
    return ((wins > 0) & (wins < n))[g]


def gtpo_scores(batch: CreditBatch, active: torch.Tensor | None = None, batch_size: int = 16,
                temperature: float = 1.0) -> torch.Tensor:
    """``[B, T]`` policy entropy of the completion tokens (the signal GTPO shapes)."""
    return completion_entropy(batch, active, batch_size, temperature)
