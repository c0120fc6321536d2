"""What a credit method reads (:class:`CreditBatch`, TRL's rollout layout) and what it returns
(:class:`TokenCredit`). Pure torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

FLAG_KEYS = ("scored", "no_answer", "too_short", "too_long", "truncated", "nonfinite", "uniform")


@dataclass(frozen=True)
class CreditBatch:
    """What a method may read, in TRL's rollout layout. Every tensor is on one device.

    ``prompt_ids`` / ``prompt_mask``: ``[B, P]`` (any padding side). ``completion_ids`` / ``completion_mask``:
    ``[B, T]`` right-padded. ``advantages``: ``[B]`` sequence advantages. ``rewards``: ``[B]`` scalar rewards.
    ``group``: ``[B]`` long, the rollout group (prompt) of each completion. ``model``: the policy (π_old).
    ``rollout``: what samples continuations and grades them (``vine``: a
    :class:`oar.credit.peers.vine.Continuations`). ``tokenizer``: the policy's tokenizer, for a method that reads
    the texts (the lab's oracles).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    advantages: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    group: torch.Tensor | None = None
    model: Any = None
    rollout: Any = None
    tokenizer: Any = None

    def rows(self, idx: torch.Tensor) -> CreditBatch:
        """The batch restricted to rows ``idx`` ([n] long)."""
        pick = {k: (v[idx] if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        if self.rollout is not None:
            pick["rollout"] = self.rollout.rows(idx)
        return CreditBatch(**pick)


@dataclass
class TokenCredit:
    """The result of :func:`token_credit`; every tensor is ``[B, T]`` (completion layout) or ``[B]``.

    ``weights``: multiplicative factor on the sequence advantage (1 where the method does not act).
    ``offsets``: added after scaling (0 unless ``combine`` is ``"add"`` or ``"replace"``; for ``"replace"`` the
    weights are 0 where the method acts, so the offsets are the token advantages there).
    ``scores``: the method's raw per-token signal (0 where it does not act). ``mask``: the tokens the method
    acted on (reasoning tokens of valid probes for probe methods, completion tokens otherwise; only rows in
    ``active``). ``answer_mask``: the final-answer statement (probe methods; else all False).
    ``flags``: ``[B]`` bool per :data:`FLAG_KEYS`.
    """

    method: str
    combine: str
    weights: torch.Tensor
    offsets: torch.Tensor
    scores: torch.Tensor
    mask: torch.Tensor
    answer_mask: torch.Tensor
    flags: dict[str, torch.Tensor] = field(default_factory=dict)

    def advantages(self, advantages: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` token advantages ``A[:, None] · weights + offsets`` from sequence advantages ``A [B]``."""
        return advantages[:, None] * self.weights.to(advantages.dtype) + self.offsets.to(advantages.dtype)

    def rows(self, rows: slice, width: int | None = None) -> TokenCredit:
        """The credit of rows ``rows`` only, cut to the first ``width`` positions (default all)."""
        T = slice(0, width)
        return TokenCredit(self.method, self.combine, self.weights[rows, T], self.offsets[rows, T],
                           self.scores[rows, T], self.mask[rows, T], self.answer_mask[rows, T],
                           {k: v[rows] for k, v in self.flags.items()})

    def counts(self) -> dict[str, int]:
        """Rows per flag, plus ``tokens`` (acted-on tokens)."""
        return {**{k: int(v.sum()) for k, v in self.flags.items()}, "tokens": int(self.mask.sum())}
