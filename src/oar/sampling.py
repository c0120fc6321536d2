"""Fast batched ancestral sampling on the CPU, and a policy copy that samples the rollouts in another dtype.

Two costs dominate ``generate`` of a small LM on a CPU (docs/results/lm_step.md): every decode step reads all the
weights (memory-bound, so bf16 weights halve it), and transformers samples with ``torch.multinomial``, which draws
one exponential variate per vocabulary entry (``exponential_`` on ``[B, V]``: 38 ms per step at B=32, V=49152,
a quarter of the whole ``generate``). :func:`sample_tokens` draws by inverse CDF (one uniform per row: a cumulative
sum and a binary search) from the same distribution. :class:`RolloutCopy` is the policy's weights in a second dtype
(bf16 on the CPU), synced before every rollout, as an inference engine holds its own copy of the weights in RL
training; the loss still reads the policy itself.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


def draw(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``logits [B, V]``: argmax iff ``temperature == 0``, else a draw from
    ``softmax(logits / temperature)`` by inverse CDF (one uniform per row). Returns ``[B]`` long."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    cdf = probs.cumsum(-1)
    u = torch.rand(logits.shape[0], 1, generator=generator, device=logits.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(1).clamp_max(logits.shape[-1] - 1)


@torch.no_grad()
def sample_tokens(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
                  temperature: float = 1.0, eos_token_ids: int | list[int] | tuple[int, ...] = (),
                  pad_token_id: int = 0, generator: torch.Generator | None = None) -> torch.Tensor:
    """KV-cached sampling of a causal LM from left-padded prompts ``input_ids``/``attention_mask [B, P]``.

    Returns the new tokens ``[B, <= max_new_tokens]``: each row up to and including its first eos, then
    ``pad_token_id``; it stops once every row has ended. Positions count real tokens only, so a left-padded row
    samples as it would alone. Rows with the same prompt (GRPO's groups) share one prefill: it runs on each
    distinct prompt once and its KV cache is repeated for the rows. Rows that have ended leave the batch (and the
    KV cache) once a quarter of the rows still running have ended, so a few long rows do not keep paying for the
    whole batch.
    """
    from transformers import DynamicCache

    eos = torch.tensor([eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids),
                       dtype=torch.long, device=input_ids.device)
    B = input_ids.shape[0]
    out = torch.full((B, max_new_tokens), pad_token_id, dtype=torch.long, device=input_ids.device)
    if max_new_tokens == 0:
        return out
    mask = attention_mask.long()
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    cache = DynamicCache()
    first, inverse = distinct_rows(torch.cat([input_ids, mask], dim=1))
    logits = model(input_ids=input_ids[first], attention_mask=mask[first], position_ids=pos[first],
                   past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    if first.numel() < B:  # a prompt shared by several rows is prefilled once; its cache is repeated for them
        cache.batch_select_indices(inverse)
        logits = logits[inverse]
    rows = torch.arange(B, device=input_ids.device)  # the original row of each row still in the batch
    done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    next_pos = pos[:, -1:] + 1
    length = 0
    for t in range(max_new_tokens):
        tok = draw(logits, temperature, generator).masked_fill(done, pad_token_id)
        out[rows, t] = tok
        length = t + 1
        done = done | torch.isin(tok, eos)
        if bool(done.all()) or t + 1 == max_new_tokens:
            break
        if int(done.sum()) * 4 >= done.numel():  # drop the ended rows from the batch and the cache
            keep = (~done).nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, tok, mask, next_pos, done = rows[keep], tok[keep], mask[keep], next_pos[keep], done[keep]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos, past_key_values=cache,
                       use_cache=True, logits_to_keep=1).logits[:, -1]
        next_pos = next_pos + 1
    return out[:, :length]


def distinct_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, inverse)`` of the rows of ``rows [B, L]``: the index of the first row of each distinct row
    ``[U]`` (in order of appearance) and each row's position in ``first`` ``[B]``, so ``rows[first][inverse]``
    equals ``rows``."""
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    n = rows.shape[0]
    first = torch.full((int(inverse.max()) + 1,), n, dtype=torch.long, device=rows.device)
    first = first.scatter_reduce(0, inverse, torch.arange(n, device=rows.device), "amin")
    order = torch.argsort(first)  # distinct rows in order of appearance
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=rows.device)
    return first[order], rank[inverse]


def plain_sampling(config: Any) -> bool:
    """Whether a ``GenerationConfig`` asks for nothing but ancestral sampling at a temperature (no top-k/top-p/
    min-p truncation, no repetition penalty, no beams), the case :func:`sample_tokens` implements."""
    def unset(name: str, neutral: float | None) -> bool:
        value = getattr(config, name, None)
        return value is None or value == neutral

    return (bool(getattr(config, "do_sample", False)) and unset("top_k", 0) and unset("top_p", 1.0)
            and unset("min_p", 0.0) and unset("repetition_penalty", 1.0) and unset("num_beams", 1)
            and unset("no_repeat_ngram_size", 0) and not getattr(config, "suppress_tokens", None)
            and not getattr(config, "bad_words_ids", None)) or (
        not getattr(config, "do_sample", False) and unset("num_beams", 1) and unset("repetition_penalty", 1.0))


class RolloutCopy:
    """The policy's weights in ``dtype`` (e.g. ``torch.bfloat16``), for sampling rollouts only.

    :meth:`sync` copies the policy's current parameters and buffers in (one cast per tensor); :meth:`generate` is
    :func:`generate` on the copy. The copy never trains.
    """

    def __init__(self, policy: Any, dtype: torch.dtype, generator: torch.Generator | None = None) -> None:
        self.dtype = dtype
        self.model = copy.deepcopy(policy).to(dtype).eval()
        # every call runs under no_grad, yet the weights must keep requires_grad: torch's matmul folds the batch
        # dims of the non-contiguous [B, 1, H] last-position slice only when the weight requires grad; otherwise it
        # materialises the LM head B times (torch 2.13: 5.8 s per prefill at B=32, V=49152; docs/results/lm_step.md)
        self.model.requires_grad_(True)
        self.generator = generator
        self._names = [n for n, _ in self.model.named_parameters()]

    @torch.no_grad()
    def sync(self, policy: Any) -> None:
        """Copy ``policy``'s parameters and buffers into the copy (same architecture; names must match)."""
        src = dict(policy.named_parameters())
        for name, p in self.model.named_parameters():
            p.copy_(src[name])
        src_buffers = dict(policy.named_buffers())
        for name, b in self.model.named_buffers():
            if name in src_buffers:
                b.copy_(src_buffers[name])

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 generation_config: Any = None, **kwargs: Any) -> torch.Tensor:
        return generate(self.model, input_ids, attention_mask, generation_config, self.generator, **kwargs)


@torch.no_grad()
def generate(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
             generation_config: Any = None, generator: torch.Generator | None = None, **kwargs: Any) -> torch.Tensor:
    """``model.generate``'s call form and result layout (``[B, P + T]``: the prompts, then the new tokens padded
    with ``pad_token_id``), by :func:`sample_tokens` when the generation config is plain sampling
    (:func:`plain_sampling`) and no other keyword is given, by transformers' ``generate`` otherwise."""
    config = generation_config if generation_config is not None else model.generation_config
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if kwargs or not plain_sampling(config):  # what the fast path does not implement: transformers' generate
        return type(model).generate(model, input_ids=input_ids, attention_mask=attention_mask,
                                    generation_config=config, **kwargs)
    eos = config.eos_token_id if config.eos_token_id is not None else []
    pad = config.pad_token_id if config.pad_token_id is not None else (eos if isinstance(eos, int) else eos[0])
    new = sample_tokens(model, input_ids, attention_mask, max_new_tokens=config.max_new_tokens,
                        temperature=config.temperature if config.do_sample else 0.0, eos_token_ids=eos,
                        pad_token_id=pad, generator=generator)
    return torch.cat([input_ids, new], dim=1)
