"""The policy's per-token entropy on the completions (one no-grad forward), shared by entropy-based peers."""

from __future__ import annotations

import torch

from oar.credit.batch import CreditBatch
from oar.importance._common import scoring_mode
from oar.teacher_forcing import completion_logprobs, supports_fast_pass


def completion_entropy(batch: CreditBatch, active: torch.Tensor | None = None, batch_size: int = 16,
                       temperature: float = 1.0) -> torch.Tensor:
    """``[B, T]`` float32: entropy (nats) of the policy's next-token distribution that produced each completion
    token (logits of prompt ⊕ completion at the position before it, divided by ``temperature`` as the sampler
    and TRL's loss do); 0 on padding and inactive rows.

    One no-grad forward of ``batch.model`` per ``batch_size`` active rows (dropout off; modes restored); for a plain
    causal LM (:func:`oar.teacher_forcing.supports_fast_pass`) the head runs on the completion positions only, in
    row chunks (no ``[b, T, V]`` logits), and a prompt shared by several rows is encoded once.
    """
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    am = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1).long()
    B, T = batch.completion_ids.shape
    out = torch.zeros(B, T, dtype=torch.float32, device=ids.device)
    rows = torch.arange(B, device=ids.device) if active is None else active.nonzero().squeeze(1)
    position_ids = (am.cumsum(dim=1) - 1).clamp_min(0)
    fast = supports_fast_pass(batch.model)
    with torch.no_grad(), scoring_mode(batch.model):
        for i in range(0, rows.numel(), batch_size):
            idx = rows[i : i + batch_size]
            if fast:  # the head on the completion positions only, in chunks; a shared prompt encoded once
                _, out[idx] = completion_logprobs(batch.model, ids[idx], am[idx], T, temperature=temperature,
                                                  position_ids=position_ids[idx])
                continue
            logits = batch.model(ids[idx], attention_mask=am[idx], position_ids=position_ids[idx],
                                 logits_to_keep=T + 1).logits[:, :-1].float() / temperature  # [b, T, V]
            logp = torch.log_softmax(logits, dim=-1)
            out[idx] = -(logp.exp() * logp).sum(dim=-1)
    return out * batch.completion_mask
