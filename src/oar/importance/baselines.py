"""Baseline scorers with the OAR scorer signature, so experiments compare like with like.

``uniform`` (all reasoning tokens equal: Bi-Level reshaping then gives weight 1, i.e. plain GRPO),
``random`` (seeded noise: a control for "any reshaping helps"), ``entropy`` (the policy's per-token
entropy, the "high-entropy minority tokens" line of work).
"""

from __future__ import annotations

import torch

from oar.importance._common import check_inputs, scoring_mode
from oar.teacher_forcing import head_logprobs, supports_fast_pass


def uniform_scores(
    model: torch.nn.Module | None,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    reasoning_mask: torch.Tensor,
    answer_mask: torch.Tensor,
) -> torch.Tensor:
    """``[B, L]`` float32: 1 on every reasoning token, 0 elsewhere (the model is not used)."""
    check_inputs(input_ids, attention_mask, reasoning_mask, answer_mask)
    return reasoning_mask.float()


def random_scores(
    model: torch.nn.Module | None,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    reasoning_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``[B, L]`` float32: U(0, 1) on reasoning tokens, 0 elsewhere; reproducible with ``generator``."""
    check_inputs(input_ids, attention_mask, reasoning_mask, answer_mask)
    gen_device = generator.device if generator is not None else input_ids.device
    noise = torch.rand(input_ids.shape, generator=generator, device=gen_device).to(input_ids.device)
    return noise * reasoning_mask


def entropy_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    reasoning_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    batch_size: int | None = None,
) -> torch.Tensor:
    """``[B, L]`` float32: entropy (nats) of the policy's next-token distribution that produced each
    reasoning token (logits at position t-1), 0 elsewhere. One no-grad forward per ``batch_size`` rows; for a plain
    causal LM (:func:`oar.teacher_forcing.supports_fast_pass`) the head runs only where a reasoning token is read."""
    check_inputs(input_ids, attention_mask, reasoning_mask, answer_mask)
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if (reasoning_mask[:, 0]).any():
        raise ValueError("a reasoning token at position 0 has no predicting position")
    B = input_ids.shape[0]
    scores = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    step = batch_size or max(B, 1)
    fast = supports_fast_pass(model)
    with torch.no_grad(), scoring_mode(model):
        for i in range(0, B, step):
            sl = slice(i, i + step)
            if not reasoning_mask[sl].any():  # nothing to score (e.g. rows without an answer)
                continue
            am = attention_mask[sl]
            position_ids = (am.long().cumsum(dim=1) - 1).clamp_min(0)
            inputs = dict(input_ids=input_ids[sl][:, :-1], attention_mask=am[:, :-1], position_ids=position_ids[:, :-1])
            if fast:  # the head at the reasoning-predicting positions only, in chunks (no [b, L, V] logits)
                m = reasoning_mask[sl, 1:]
                hidden = model.base_model(**inputs).last_hidden_state[m]
                _, entropy = head_logprobs(hidden, model.get_output_embeddings().weight, input_ids[sl][:, 1:][m])
                scores[sl, 1:] = scores[sl, 1:].masked_scatter(m, entropy)
                continue
            logp = torch.log_softmax(model(**inputs).logits.float(), dim=-1)
            entropy = -(logp.exp() * logp).sum(dim=-1)
            scores[sl, 1:] = entropy * reasoning_mask[sl, 1:]
    return scores
