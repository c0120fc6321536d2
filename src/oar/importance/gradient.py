"""OAR-G (OAR_SPEC §3): gradient × input on the input embeddings, one forward + backward per batch.

``J = KL(P_0 || P_final(e + δ))`` (modes ``last`` / ``answer_mean``, δ ~ N(0, σ²) on the reasoning
rows; the KL has zero gradient at δ = 0) or ``J = φ_0 - φ(e + δ)`` (``answer_joint``; σ = 0 allowed,
and φ_0 is a constant so no clean forward is needed). ``I_t = |Σ_h (∂J/∂e_t)_h e_{t,h}|``.
The columns before every row's first reasoning token (the prompt), when long enough or shared by several rows (a
GRPO group's probes), run once per distinct prefix without autograd into a key/value cache that both passes read;
the passes stop after the last position the outcome reads.
The embeddings ``e`` are taken from the embedding layer's output inside the model's forward (a hook), never by
calling the layer directly, so the scorer also runs on a model whose weights are sharded (FSDP2).

Only ``torch.autograd.grad(J, e)`` is called: no parameter ``.grad`` is created or changed, parameters
keep their ``requires_grad``, dropout is off while scoring and every module's mode is restored.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from oar.importance._common import check_inputs, divergence, outcome, readout_positions, scoring_mode
from oar.sampling import distinct_rows

# OAR-G's noise σ in the KL modes when none is given (OAR_SPEC §3: the KL has zero gradient at δ = 0)
KL_NOISE_STD = 1e-3
# Shortest shared prefix (tokens) worth a cached no-grad pass: the break-even measured on one CPU thread (hidden
# 256 × 4 layers, completion 256, batch 8): 48-token prefix ±0 %, 128 tokens −21 %, 16 tokens +7–15 %
PREFIX_CACHE_MIN = 48


def gradient_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    reasoning_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    mode: str = "answer_joint",
    noise_std: float | None = None,
    generator: torch.Generator | None = None,
    batch_size: int | None = None,
    prefix_cache_min: int = PREFIX_CACHE_MIN,
) -> torch.Tensor:
    """OAR-G importance of every reasoning token.

    Args:
        model: a Hugging Face causal LM (any dtype; the outcome is computed in float32).
        input_ids / attention_mask: ``[B, L]`` probes (any padding side).
        reasoning_mask / answer_mask: ``[B, L]`` bool; reasoning tokens must precede the answer.
        mode: ``"answer_joint"`` (default; the paper's is ``"answer_mean"``, see docs/importance.md), ``"last"`` or
            ``"answer_mean"``.
        noise_std: σ of the embedding noise on reasoning rows (> 0 for the KL modes); None: 0 for
            ``answer_joint`` (no noise, deterministic), :data:`KL_NOISE_STD` for the KL modes.
        generator: a ``torch.Generator`` for reproducible noise (the noise of the whole batch is drawn
            at once, so results do not depend on ``batch_size``).
        batch_size: rows per forward/backward (default: the whole batch).
        prefix_cache_min: the columns before every row's first reasoning token run once without autograd into a
            key/value cache when there are at least this many, or when several rows share them (once per distinct
            prefix; same scores; see :data:`PREFIX_CACHE_MIN`).

    Returns:
        ``[B, L]`` float32 scores, 0 outside the reasoning and on rows without reasoning or answer.
    """
    check_inputs(input_ids, attention_mask, reasoning_mask, answer_mask, mode)
    if noise_std is None:
        noise_std = 0.0 if mode == "answer_joint" else KL_NOISE_STD
    if noise_std < 0 or (noise_std == 0 and mode != "answer_joint"):
        raise ValueError(f"noise_std must be > 0 for mode {mode!r} (>= 0 for answer_joint), got {noise_std}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    B, L = input_ids.shape
    device = input_ids.device
    pos = torch.arange(L, device=device).expand(B, L)
    rows = (reasoning_mask.any(dim=1) & answer_mask.any(dim=1)).nonzero().squeeze(1)
    step = batch_size or max(rows.numel(), 1)
    embed = model.get_input_embeddings()
    # inference_mode(False): callers under torch.inference_mode() still get a differentiable graph
    with torch.inference_mode(False), scoring_mode(model):
        scores = torch.zeros(B, L, dtype=torch.float32, device=device)
        noise = None
        if noise_std > 0:
            gen_device = generator.device if generator is not None else device
            noise = torch.randn(B, L, embed.embedding_dim, generator=generator, device=gen_device)
            noise = (noise * noise_std).to(device)
        for i in range(0, rows.numel(), step):
            idx = rows[i : i + step]
            ids, am = input_ids[idx].clone(), attention_mask[idx].clone()
            reasoning = reasoning_mask[idx].clone()
            position_ids = (am.long().cumsum(dim=1) - 1).clamp_min(0)
            keep, sel, targets = readout_positions(ids, answer_mask[idx].clone(), mode)
            # columns [0, cut) precede every row's reasoning: their keys/values are computed once, without autograd;
            # the passes run only columns [cut, end), end = after the last position the outcome reads
            cut = int(torch.where(reasoning, pos[: idx.numel()], L).amin())
            # rows whose columns before the cut are equal (a GRPO group's probes) share one prefix pass
            first, inverse = distinct_rows(torch.cat([ids[:, :cut], am[:, :cut]], dim=1)) if cut else (None, None)
            shared = first is not None and first.numel() < idx.numel()
            cut = cut if cut >= max(prefix_cache_min, 1) or (shared and cut > 0) else 0
            end = int(keep[-1]) + 1
            cols = slice(cut, end)
            prefix = None
            if cut > 0:
                with torch.no_grad():
                    prefix = model(input_ids=ids[first, :cut], attention_mask=am[first, :cut],
                                   position_ids=position_ids[first, :cut], use_cache=True,
                                   logits_to_keep=1).past_key_values
                if shared:
                    prefix.batch_select_indices(inverse)
            with torch.no_grad():
                if mode != "answer_joint":
                    logits = model(input_ids=ids[:, cols], attention_mask=am[:, :end],
                                   position_ids=position_ids[:, cols], past_key_values=copy.deepcopy(prefix),
                                   use_cache=prefix is not None, logits_to_keep=keep - cut).logits
                    reference = outcome(logits, sel, targets, mode)
            delta = None if noise is None else (noise[idx] * reasoning[..., None])[:, cols]
            with torch.enable_grad(), _embedding_leaf(embed, delta) as leaf:
                logits = model(input_ids=ids[:, cols], attention_mask=am[:, :end], position_ids=position_ids[:, cols],
                               past_key_values=prefix, use_cache=prefix is not None, logits_to_keep=keep - cut).logits
                new = outcome(logits, sel, targets, mode)
                objective = -new if mode == "answer_joint" else divergence(reference, new, mode)
                (grad,) = torch.autograd.grad(objective.sum(), leaf[-1])
            e = leaf[-1].detach()
            scores[idx, cols] = (grad.float() * e.float()).sum(dim=-1).abs() * reasoning[:, cols]
    return scores


@contextmanager
def _embedding_leaf(embed: torch.nn.Module, delta: torch.Tensor | None) -> Iterator[list[torch.Tensor]]:
    """During the forward, detach the embedding output ``e`` into a leaf that requires grad and feed ``e + delta``
    on; the list holds that leaf. The embeddings are read inside the model's own forward, so sharded weights
    (FSDP2 DTensors) are handled by the wrapper."""
    leaf: list[torch.Tensor] = []

    def hook(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        e = output.detach().requires_grad_(True)
        leaf.append(e)
        return e if delta is None else e + delta.to(e.dtype)

    handle = embed.register_forward_hook(hook)
    try:
        yield leaf
    finally:
        handle.remove()
