"""Shared pieces of the scorers: input checks, scoring mode, and the outcome readout P_final / φ."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

MODES: tuple[str, ...] = ("last", "answer_mean", "answer_joint")


def check_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    reasoning_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    mode: str | None = None,
) -> None:
    """ValueError unless all four are ``[B, L]``, the masks bool, and every row's reasoning tokens are
    attended and precede its first answer token (which must have a predecessor)."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, L], got shape {tuple(input_ids.shape)}")
    for name, t in (("attention_mask", attention_mask), ("reasoning_mask", reasoning_mask),
                    ("answer_mask", answer_mask)):
        if t.shape != input_ids.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != input_ids shape {tuple(input_ids.shape)}")
    for name, t in (("reasoning_mask", reasoning_mask), ("answer_mask", answer_mask)):
        if t.dtype != torch.bool:
            raise ValueError(f"{name} must be a bool tensor, got {t.dtype}")
    attended = attention_mask.bool()
    if (reasoning_mask & ~attended).any() or (answer_mask & ~attended).any():
        raise ValueError("reasoning and answer tokens must be attended (attention_mask 1)")
    pos = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    first_answer = torch.where(answer_mask, pos, input_ids.shape[1]).amin(dim=1)
    last_reasoning = torch.where(reasoning_mask, pos, -1).amax(dim=1)
    has_answer = answer_mask.any(dim=1)
    if (has_answer & (last_reasoning >= first_answer)).any():
        raise ValueError("every reasoning token must precede the row's first answer token")
    first_real = torch.where(attended, pos, input_ids.shape[1]).amin(dim=1)
    if (has_answer & (first_answer <= first_real)).any():
        raise ValueError("the first answer token needs a preceding attended token to predict it")


@contextmanager
def scoring_mode(model: torch.nn.Module) -> Iterator[None]:
    """Dropout off while scoring; every submodule's train/eval flag is restored exactly afterwards."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


def outcome(logits: torch.Tensor, sel: torch.Tensor, targets: torch.Tensor, mode: str) -> torch.Tensor:
    """The outcome read from logits at the answer-predicting positions, in float32.

    Args:
        logits: ``[N, K, V]`` at K candidate positions. sel: ``[N, K]`` bool, the positions predicting an
            answer token. targets: ``[N, K]`` long, the answer token each selected position predicts.

    Returns:
        ``[N, V]`` log P_final for ``last`` (first selected position) and ``answer_mean`` (mean logits,
        then log-softmax); ``[N]`` φ = mean answer-token log-prob for ``answer_joint``.
    """
    logits = logits.float()
    w = sel.to(logits.dtype)
    if mode == "last":
        first = sel.to(torch.uint8).argmax(dim=1)
        return F.log_softmax(logits[torch.arange(logits.shape[0], device=logits.device), first], dim=-1)
    if mode == "answer_mean":
        mean = (logits * w[..., None]).sum(dim=1) / w.sum(dim=1, keepdim=True).clamp_min(1.0)
        return F.log_softmax(mean, dim=-1)
    token_lp = F.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    return (token_lp * w).sum(dim=1) / w.sum(dim=1).clamp_min(1.0)


def divergence(reference: torch.Tensor, new: torch.Tensor, mode: str) -> torch.Tensor:
    """``[N]`` KL(P_ref || P_new) from log-probs ``[N, V]``, or φ_ref - φ_new for ``answer_joint``."""
    if mode == "answer_joint":
        return reference - new
    return (reference.exp() * (reference - new)).sum(dim=-1)


def readout_positions(
    input_ids: torch.Tensor, answer_mask: torch.Tensor, mode: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The positions whose logits the outcome needs, shared by the rows of a batch.

    Returns ``keep`` ``[K]`` sorted positions (for ``logits_to_keep``), ``sel`` ``[B, K]`` bool and
    ``targets`` ``[B, K]`` long for :func:`outcome`. ``last`` keeps only each row's first position.
    """
    predicting = torch.zeros_like(answer_mask)
    predicting[:, :-1] = answer_mask[:, 1:]
    if mode == "last":
        predicting &= predicting.long().cumsum(dim=1) == 1
    keep = predicting.any(dim=0).nonzero().squeeze(1)
    next_ids = torch.roll(input_ids, -1, dims=1)
    return keep, predicting[:, keep], next_ids[:, keep]


def resolve_replace_id(model: torch.nn.Module, replace_id: int | None) -> int:
    """``replace_id`` or the model config's pad id; ValueError if neither exists."""
    if replace_id is None:
        replace_id = getattr(getattr(model, "config", None), "pad_token_id", None)
    if replace_id is None:
        raise ValueError("the model config has no pad_token_id: pass replace_id explicitly")
    return int(replace_id)
