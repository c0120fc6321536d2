"""High-entropy minority tokens ("Beyond the 80/20 Rule", Wang et al., arXiv 2506.01939).

Only the top-ρ fraction of the batch's completion tokens by the policy's entropy keep their advantage
(ρ = 0.2); the others get weight 0. A mask, not a reweighting, with the loss's denominators unchanged
(TRL's ``top_entropy_quantile`` semantics: interpolated quantile threshold, ``H >= τ``). Choices the paper leaves
open or where its official code differs (docs/credits.md): the entropy is π_old's from one extra forward over the
rollout batch of this process (the official code uses the current policy in the loss forward, per GPU
micro-batch, exact top-⌈ρN⌉, and divides by the kept tokens only).
"""

from __future__ import annotations

import torch

from oar.credit.batch import CreditBatch
from oar.credit.peers._entropy import completion_entropy


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, rho: float = 0.2) -> torch.Tensor:
    """``[B, T]`` float 0/1: 1 where ``entropy >= `` the (1 - ρ)-quantile of the masked entropies of the whole
    batch (linear interpolation, as ``torch.quantile``), 0 elsewhere (and on unmasked tokens).

    Args:
        entropy: ``[B, T]`` per-token entropies (nats). mask: ``[B, T]`` bool, the tokens that count.
        rho: fraction of tokens kept, in (0, 1].
    """
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must be in (0, 1], got {rho!r}")
    values = entropy[mask].float()
    if values.numel() == 0:
        return torch.zeros_like(entropy, dtype=torch.float32)
    threshold = torch.quantile(values, 1.0 - rho)
    return ((entropy >= threshold) & mask).float()


def entropy_mask_scores(batch: CreditBatch, active: torch.Tensor | None = None, batch_size: int = 16,
                        temperature: float = 1.0) -> torch.Tensor:
    """``[B, T]`` entropy of the completion tokens under the policy (see :func:`completion_entropy`)."""
    return completion_entropy(batch, active, batch_size, temperature)
