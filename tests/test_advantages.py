"""group_advantages against TRL's own formula and against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from oar import group_advantages


def trl_advantages(rewards: torch.Tensor, group_size: int, scale: str) -> torch.Tensor:
    """TRL 1.16 GRPOTrainer's single-reward path, computed with TRL's own nanstd."""
    from trl.trainer.utils import nanstd

    mean = torch.nanmean(rewards.view(-1, group_size), dim=1).repeat_interleave(group_size)
    if scale in ("group", "none"):
        std = nanstd(rewards.view(-1, group_size), dim=1).repeat_interleave(group_size)
    else:
        std = nanstd(rewards).expand_as(rewards)
    adv = rewards - mean
    if scale != "none":
        adv = adv / (std + 1e-4)
    return torch.nan_to_num(adv, nan=0.0)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("group_size", [2, 4, 8])
def test_matches_trl(scale, group_size):
    gen = torch.Generator().manual_seed(group_size)
    for binary in (True, False):
        r = torch.rand(6 * group_size, generator=gen)
        r = (r > 0.5).float() if binary else r
        ours = group_advantages(r, group_size, scale=scale)
        assert torch.allclose(ours, trl_advantages(r, group_size, scale), atol=1e-6, rtol=0)


def test_hand_computed_group():
    r = torch.tensor([1.0, 0.0, 0.0, 2.0, 2.0, 2.0])
    a = group_advantages(r, 3, eps=0.0)
    std = torch.tensor([1.0, 0.0, 0.0]).std()  # Bessel-corrected
    assert torch.allclose(a[:3], (torch.tensor([1.0, 0.0, 0.0]) - 1 / 3) / std)
    assert torch.equal(a[3:], torch.zeros(3))  # equal rewards: zero advantage even with eps=0


def test_nan_reward_is_left_out_and_gets_zero():
    r = torch.tensor([1.0, float("nan"), 0.0, 1.0])
    a = group_advantages(r, 4)
    assert a[1] == 0
    rest = group_advantages(torch.tensor([1.0, 0.0, 1.0]), 3)
    assert torch.allclose(a[[0, 2, 3]], rest)


def test_dtype_device_kept():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    assert group_advantages(r, 2).dtype == torch.float64


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rewards=torch.zeros(6), group_size=4), "group_size=4 does not divide"),
        (dict(rewards=torch.zeros(6), group_size=0), "group_size must be a positive integer"),
        (dict(rewards=torch.zeros(2, 3), group_size=3), "1-D tensor"),
        (dict(rewards=torch.zeros(6, dtype=torch.long), group_size=3), "floating-point"),
        (dict(rewards=torch.zeros(6), group_size=3, scale="global"), "scale must be one of"),
        (dict(rewards=torch.zeros(0), group_size=1), "does not divide"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(**kwargs)
