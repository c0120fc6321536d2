"""Teacher-forced passes of a causal LM over ``[prompt | completion]`` rows: the completion tokens' log-probabilities
and entropies, computed the way a CPU (or any memory-bound device) can afford.

Two costs of the plain pass (``model(input_ids).logits`` then a log-softmax) are avoidable:

- **The LM head over every position.** ``[B, T, V]`` float32 logits (V = 49k-152k) are most of a small model's
  memory, and on a CPU TRL's fused head scores every position, the prompt's included. :func:`head_logprobs`
  projects only the positions asked for, in row chunks, and recomputes each chunk's logits in the backward pass
  instead of keeping them (the scheme of TRL's ``selective_log_softmax`` / fused head and verl's chunked entropy,
  written here for any back-end): peak memory one chunk of logits, at the cost of one more head matmul.
- **A group's shared prompt, encoded once per completion.** GRPO's G completions of a problem share its prompt.
  :func:`completion_logprobs` runs the backbone on each distinct prompt once, repeats its key/value cache for the
  rows that share it (an indexed copy: gradients flow back through it into the one prompt pass) and runs the
  completions against it. Positions and masks are those of the full pass, so the result is the same function of
  the weights; only the floating-point rounding of differently shaped matmuls changes (measured in
  docs/results/lm_step.md).

Both need a Hugging Face causal LM whose logits are ``lm_head(base_model(...))`` divided by a temperature;
:func:`supports_fast_pass` says whether a model is one (no logit soft-capping or scaling, a plain linear head).
"""

from __future__ import annotations

from typing import Any

import torch

from oar.sampling import distinct_rows

# config fields that change logits after the head (TRL's fused head reads the same ones)
SCALING_FIELDS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                  "logits_scaling")
# logits elements per chunk of rows in head_logprobs (2**25 float32 = 128 MiB, ~680 rows at V = 49,152)
CHUNK_ELEMENTS = 2**25


class _HeadLogProbs(torch.autograd.Function):
    """``log_softmax(h @ W^T / T)[label]`` and the entropy of that softmax, row chunk by row chunk; the backward
    pass recomputes each chunk's logits (gradient through the log-probabilities only; the entropy is a readout)."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, inv_temperature: float, rows: int):
        w = weight.to(hidden.dtype)
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty_like(logp)
        lse = torch.empty_like(logp)
        for s in range(0, n, rows):
            logits = (hidden[s:s + rows] @ w.T).float().mul_(inv_temperature)  # [rows, V]
            z = torch.logsumexp(logits, dim=-1)
            logp[s:s + rows] = logits.gather(1, labels[s:s + rows, None]).squeeze(1) - z
            p = (logits - z[:, None]).exp_()
            entropy[s:s + rows] = z - (p * logits).sum(-1)
            lse[s:s + rows] = z
        ctx.save_for_backward(hidden, weight, labels, lse)
        ctx.inv_temperature, ctx.rows = inv_temperature, rows
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, labels, lse = ctx.saved_tensors
        w = weight.to(hidden.dtype)
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        for s in range(0, hidden.shape[0], ctx.rows):
            h, g = hidden[s:s + ctx.rows], grad_logp[s:s + ctx.rows].float()
            logits = (h @ w.T).float().mul_(ctx.inv_temperature)
            # d logp / d logits = onehot(label) - softmax, times the incoming gradient and 1/T
            d = (logits - lse[s:s + ctx.rows, None]).exp_().mul_(-g[:, None])
            d.scatter_add_(1, labels[s:s + ctx.rows, None], g[:, None])
            d = d.mul_(ctx.inv_temperature).to(hidden.dtype)
            if want_h:
                grad_h[s:s + ctx.rows] = d @ w
            if want_w:
                grad_w += (d.T @ h).float()
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                  temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of ``labels [N]`` and entropy (nats) under ``softmax(hidden [N, H] @ weight[V, H]^T /
    temperature)``, both ``[N]`` float32, never holding more than a chunk of the ``[N, V]`` logits. Differentiable
    in ``hidden`` and ``weight`` through the log-probabilities."""
    rows = max(1, CHUNK_ELEMENTS // weight.shape[0])
    return _HeadLogProbs.apply(hidden, weight, labels, 1.0 / temperature, rows)


def supports_fast_pass(model: Any) -> bool:
    """Whether ``model``'s logits are ``get_output_embeddings()(base_model(...).last_hidden_state)`` with a plain
    bias-free linear head and no soft-capping or logit scaling, so :func:`completion_logprobs` computes its pass."""
    config = getattr(model, "config", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if config is None or not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return False
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    scaled = any(getattr(text, name, None) not in (None, 1.0) for name in SCALING_FIELDS)
    base = getattr(model, "base_model", None)
    sharded = type(head.weight).__name__ != "Parameter" or type(head.weight.data).__name__ == "DTensor"  # FSDP2
    return not scaled and not sharded and base is not None and base is not model


def _new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # transformers releases whose DynamicCache takes no config
        return DynamicCache()


def completion_hidden(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_length: int,
                      *, share_prompt: bool = True, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, C, H]``: the backbone's last hidden state at the positions that predict the last ``C =
    completion_length`` tokens of ``input_ids [B, P + C]`` (positions ``P - 1 .. P + C - 2``), the input of the LM
    head there. ``position_ids`` ``[B, P + C]``: the model's default (``0..P+C-1``) when None.

    ``share_prompt``: rows whose first ``P`` tokens, mask and positions are equal are encoded once, their key/value
    cache repeated for the rows (differentiable: gradients flow back into the one prompt pass); with no repeated
    prompt it is one plain pass. Needs :func:`supports_fast_pass` and ``P >= 1``."""
    C = completion_length
    P = input_ids.shape[1] - C
    if P < 1:
        raise ValueError(f"completion_logprobs needs at least one prompt token, got {input_ids.shape[1]} tokens "
                         f"for a completion of {C}")
    backbone = model.base_model
    prompt_ids, prompt_mask = input_ids[:, :P], attention_mask[:, :P]
    pos = {} if position_ids is None else {"position_ids": position_ids}
    first = inverse = None
    if share_prompt:
        key = [prompt_ids, prompt_mask.to(prompt_ids.dtype)]
        first, inverse = distinct_rows(torch.cat(key + ([] if position_ids is None else [position_ids[:, :P]]), 1))
    if first is not None and first.numel() < input_ids.shape[0]:
        cache = _new_cache(model)
        head_pos = {k: v[first, :P] for k, v in pos.items()}
        prefix = backbone(input_ids=prompt_ids[first], attention_mask=prompt_mask[first], past_key_values=cache,
                          use_cache=True, **head_pos).last_hidden_state  # [U, P, H]
        cache.batch_select_indices(inverse)  # each row's prompt keys/values: an indexed, differentiable copy
        rest = backbone(input_ids=input_ids[:, P:], attention_mask=attention_mask, past_key_values=cache,
                        use_cache=True, **{k: v[:, P:] for k, v in pos.items()}).last_hidden_state  # [B, C, H]
        return torch.cat([prefix[inverse, -1:], rest[:, :-1]], dim=1)
    return backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                    **pos).last_hidden_state[:, P - 1:-1]


def completion_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_length: int,
                        *, temperature: float = 1.0, share_prompt: bool = True,
                        position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities and entropies ``[B, C]`` (float32; 0 where ``attention_mask`` is 0) of the last
    ``C = completion_length`` tokens of ``input_ids [B, P + C]`` given everything before them, at ``temperature``:
    the quantity TRL's loss reads (``_get_per_token_logps_and_entropies``), with the same positions (the model's
    default, ``0..P+C-1``, unless ``position_ids`` is given) and masks. The passes: :func:`completion_hidden`, then
    :func:`head_logprobs` on the completion's real positions only."""
    C = completion_length
    hidden = completion_hidden(model, input_ids, attention_mask, C, share_prompt=share_prompt,
                               position_ids=position_ids)
    mask = attention_mask[:, -C:].bool()
    logp, entropy = head_logprobs(hidden[mask], model.get_output_embeddings().weight, input_ids[:, -C:][mask],
                                  temperature)
    zeros = torch.zeros(mask.shape, dtype=torch.float32, device=input_ids.device)
    return zeros.masked_scatter(mask, logp), zeros.masked_scatter(mask, entropy)


@torch.no_grad()
def head_kl(hidden_p: torch.Tensor, hidden_q: torch.Tensor, weight: torch.Tensor,
            temperature: float = 1.0) -> torch.Tensor:
    """``[N]`` float32 ``KL(p || q)`` (nats) between ``softmax(hidden_p @ weight^T / temperature)`` and the same of
    ``hidden_q`` (both ``[N, H]``), row chunk by row chunk (never the ``[N, V]`` logits whole); no gradient."""
    rows = max(1, CHUNK_ELEMENTS // weight.shape[0])
    w = weight.to(hidden_p.dtype)
    out = torch.empty(hidden_p.shape[0], dtype=torch.float32, device=hidden_p.device)
    for s in range(0, hidden_p.shape[0], rows):
        lp = torch.log_softmax((hidden_p[s:s + rows] @ w.T).float() / temperature, dim=-1)
        lq = torch.log_softmax((hidden_q[s:s + rows] @ w.T).float() / temperature, dim=-1)
        out[s:s + rows] = (lp.exp() * (lp - lq)).sum(-1)
    return out
