"""GRPO sequence advantages from group-laid-out rewards (OAR_SPEC §1)."""

from __future__ import annotations

import torch

SCALES = ("group", "batch", "none")


def _nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Bessel-corrected standard deviation ignoring NaNs (the estimator TRL uses)."""
    mean = torch.nanmean(x, dim=dim, keepdim=True) if dim is not None else torch.nanmean(x)
    sq = (x - mean) ** 2
    var = torch.nanmean(sq, dim=dim, keepdim=keepdim) if dim is not None else torch.nanmean(sq)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=keepdim) if dim is not None else (~torch.isnan(x)).sum()
    return torch.sqrt(var * count / (count - 1))


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4
) -> torch.Tensor:
    """GRPO advantages ``A_i = (r_i - mean_group r) / (std + eps)``.

    Args:
        rewards: ``[N]`` float rewards, laid out group by group (``N = num_groups * group_size``).
            NaN marks an unscorable completion: it is left out of its group's statistics and gets 0.
        group_size: completions per prompt (G).
        scale: ``"group"`` (std within each group), ``"batch"`` (std over all N) or ``"none"``
            (no division, Dr. GRPO). The mean is always the group mean.
        eps: added to the std before dividing.

    Returns:
        ``[N]`` advantages, same dtype and device as ``rewards``; equal to TRL's ``GRPOTrainer``.
    """
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1:
        raise ValueError(f"rewards must be a 1-D tensor, got {type(rewards).__name__} "
                         f"of shape {tuple(getattr(rewards, 'shape', ()))}")
    if not rewards.is_floating_point():
        raise ValueError(f"rewards must be a floating-point tensor, got dtype {rewards.dtype}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    n = rewards.numel()
    if n == 0 or n % group_size != 0:
        raise ValueError(f"group_size={group_size} does not divide the number of rewards N={n}")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")

    grouped = rewards.view(-1, group_size)
    mean = torch.nanmean(grouped, dim=1, keepdim=True).expand_as(grouped).reshape(-1)
    advantages = rewards - mean
    if scale == "group":
        std = _nanstd(grouped, dim=1, keepdim=True).expand_as(grouped).reshape(-1) if group_size > 1 \
            else torch.zeros_like(rewards)
        advantages = advantages / (std + eps)
    elif scale == "batch":
        std = _nanstd(rewards) if n > 1 else torch.zeros((), dtype=rewards.dtype, device=rewards.device)
        advantages = advantages / (std + eps)
    return torch.nan_to_num(advantages, nan=0.0)
