"""TRL's GRPO loss, computed in micro-batches of whole prompt groups (``OARConfig.oar_loss_batch_size``).

TRL's loss forward holds the activations of the whole rollout batch until its backward (16 GB of resident memory
for the CPU demo's 32 completions). Splitting the batch into micro-batches, each run forward and backward before
the next, bounds that at one micro-batch; keeping a prompt's completions together keeps what
:func:`oar.teacher_forcing.completion_logprobs` shares. A micro-batch's loss is TRL's loss of its rows times the
weight that makes the micro-batches sum to the whole batch's loss: TRL normalises the loss per row (``grpo``,
``dr_grpo``, ``sapo``, ``luspo``: weight rows_i / rows), per token (``bnpo``: tokens_i / tokens) or by the
batch's global token count already (``dapo``, ``cispo``, ``vespo``: weight 1). The sum of the micro-batches'
gradients is the whole batch's gradient up to floating-point rounding (tests/test_trainer.py measures it).
"""

from __future__ import annotations

from typing import Any

import torch

from oar.sampling import distinct_rows

ROW_NORMALISED = frozenset({"grpo", "dr_grpo", "sapo", "luspo"})
TOKEN_NORMALISED = frozenset({"bnpo"})
GLOBALLY_NORMALISED = frozenset({"dapo", "cispo", "vespo"})


def chunking_blocker(trainer: Any) -> str | None:
    """Why ``trainer``'s loss cannot be split into micro-batches exactly (a TRL feature that reads the whole
    batch at once), or None when it can."""
    args = trainer.args
    if trainer.loss_type not in ROW_NORMALISED | TOKEN_NORMALISED | GLOBALLY_NORMALISED:
        return f"loss_type={trainer.loss_type!r} (micro-batch weights are known for " \
               f"{sorted(ROW_NORMALISED | TOKEN_NORMALISED | GLOBALLY_NORMALISED)})"
    if getattr(trainer, "_entropy_bonus_enabled", False):
        return "the entropy bonus (a token mean over each micro-batch)"
    if getattr(args, "top_entropy_quantile", 1.0) < 1.0:
        return "top_entropy_quantile < 1 (a quantile over the batch)"
    if getattr(trainer, "aux_loss_enabled", False):
        return "an MoE router loss (a batch mean)"
    if getattr(trainer, "use_liger_kernel", False):
        return "use_liger_kernel"
    if trainer.accelerator.num_processes > 1 or trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        return "several processes, FSDP or DeepSpeed (one process only)"
    return None


def loss_chunks(inputs: dict[str, Any], rows: int, loss_type: str) -> list[tuple[torch.Tensor, float]] | None:
    """The micro-batches of a TRL loss batch: ``(row indices, weight)`` pairs, each at most ``rows`` completions
    of whole prompts (a prompt with more completions than ``rows`` is one micro-batch of its own), in the order
    of their first rows; None when the batch fits in one."""
    prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
    n = prompt_ids.shape[0]
    if n <= rows:
        return None
    _, group = distinct_rows(torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1))
    order = torch.argsort(group, stable=True)  # rows grouped by prompt, each group in batch order
    sizes = torch.bincount(group).tolist()
    chunks, current, start = [], [], 0
    for size in sizes:
        if current and sum(map(len, current)) + size > rows:
            chunks.append(torch.cat(current))
            current = []
        current.append(order[start:start + size])
        start += size
    chunks.append(torch.cat(current))
    tokens = inputs["completion_mask"].sum()
    out = []
    for idx in chunks:
        if loss_type in ROW_NORMALISED:
            weight = idx.numel() / n
        elif loss_type in TOKEN_NORMALISED:
            weight = float(inputs["completion_mask"][idx].sum() / tokens.clamp(min=1))
        else:
            weight = 1.0
        out.append((idx, weight))
    return out


def take_rows(inputs: dict[str, Any], idx: torch.Tensor) -> dict[str, Any]:
    """``inputs`` with every per-row entry (a tensor or list with one entry per completion) cut to rows ``idx``;
    batch-level entries (``num_items_in_batch``, scalars) kept."""
    n = inputs["prompt_ids"].shape[0]
    out = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n:
            out[k] = v[idx.to(v.device)]
        elif isinstance(v, list) and len(v) == n:
            out[k] = [v[i] for i in idx.tolist()]
        else:
            out[k] = v
    return out
