"""Scoring with a sharded policy: the full weights for the scoring pass, and equal collective calls on every rank.

The OAR scorers run plain forward passes and an inputs-only ``torch.autograd.grad`` on a Hugging Face module.
Under FSDP2 or DeepSpeed ZeRO-3 every forward of a sharded module all-gathers its weights, so ranks that make
different numbers of passes pair up the wrong collectives and hang or abort. Two pieces fix that:

* :func:`full_policy` yields the policy with its full weights on every rank for the whole scoring pass (FSDP2:
  unsharded once, kept unsharded through the inputs-only backward, resharded on exit; ZeRO-3: gathered with the
  ZeRO-3 hooks off). Inside it a pass makes no collective call, so the unchanged scorers run and are exact. Cost:
  one full copy of the weights per rank while scoring (the same as TRL's ZeRO-3 generation).
* :func:`equal_scorer_calls` (for a credit method) and :func:`pad_to_max_over_ranks` (for any list of work) pad
  the number of scorer calls to the maximum over ranks with dummy calls (:func:`dummy_probe`), so every rank
  makes the same calls; a rank with nothing to score still joins.

A method that reads whole rollout groups (``needs_group``) on a batch split over data-parallel ranks runs through
:func:`group_token_credit`: every rank's rows are gathered (:func:`gather_rows`), scored together, and each rank
keeps its own rows. The TRL trainer and the verl plugin both use it.

FSDP1 is refused (:data:`FSDP1_MESSAGE`): its flat parameters cannot be scored through the unwrapped module, and
an inputs-only backward drops accumulated gradients with ``use_orig_params=False``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist

from oar.credit import CreditBatch, ResolvedCredit, TokenCredit, call_with_options, token_credit

Sharding = Literal["fsdp1", "fsdp2", "zero3"]
T = TypeVar("T")

FSDP1_MESSAGE = (
    "OAR credit scores tokens with the full policy, which FSDP1 cannot provide (flat parameters; an inputs-only "
    "backward drops accumulated gradients): use FSDP2 (accelerate config `fsdp_version: 2`), DeepSpeed ZeRO-3 "
    "or ZeRO-2, DDP, or credit='grpo'"
)


def sharding_of(model: torch.nn.Module) -> Sharding | None:
    """How ``model`` (the wrapped model a trainer holds) is sharded: ``"fsdp1"``, ``"fsdp2"``, ``"zero3"``, or
    None when every rank holds the full weights (single process, DDP, ZeRO-1/2)."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel) or any(
        isinstance(m, FullyShardedDataParallel) for m in model.modules()
    ):
        return "fsdp1"
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        return "fsdp2"
    stage = getattr(model, "zero_optimization_stage", None)  # a DeepSpeedEngine
    if callable(stage) and stage() == 3:
        return "zero3"
    return None


@contextmanager
def full_policy(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The policy with its full weights on every rank, for a scoring pass; ``model`` is the wrapped model.

    Yields the module to call the scorers on (the FSDP2 module itself, the ZeRO-3 engine's ``.module``, the
    module inside DDP). Every rank must enter and leave together (entering gathers the weights). Inside, no
    forward or backward makes a collective call, and parameter ``.grad`` is not touched by inputs-only
    backwards. Peak extra memory: one full copy of the weights per rank.
    """
    kind = sharding_of(model)
    if kind == "fsdp1":
        raise ValueError(FSDP1_MESSAGE)
    if kind == "fsdp2":
        with fsdp2_unsharded(model):
            yield model
    elif kind == "zero3":
        with zero3_gathered(model):
            yield model.module
    else:
        yield getattr(model, "module", model) if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


@contextmanager
def fsdp2_unsharded(model: torch.nn.Module) -> Iterator[None]:
    """Unshard every FSDP2 module of ``model`` once and keep it unsharded through forwards and backwards;
    restore the reshard settings and reshard on exit (also on error).

    Entering all-gathers each FSDP2 module's weights in module order (the same on every rank); inside, no
    forward or inputs-only backward all-gathers or reduce-scatters, so ranks may make different numbers of
    passes. Gradients a backward does produce inside stay unsharded until the next FSDP2 backward reduces them.
    """
    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        yield
        return
    # the root decides at its lazy init not to reshard after forward; do it now so restoring below is exact
    modules[0]._get_fsdp_state()._lazy_init()
    groups = [g for m in modules for g in m._get_fsdp_state()._fsdp_param_groups]
    saved = [(g.post_forward_mesh_info, g.reshard_after_backward) for g in groups]
    try:
        for m in modules:
            m.unshard()
        for g in groups:
            g.post_forward_mesh_info = None  # no reshard after forward
            g.reshard_after_backward = False
        yield
    finally:
        for g, (mesh_info, after_backward) in zip(groups, saved, strict=True):
            g.post_forward_mesh_info = mesh_info
            g.reshard_after_backward = after_backward
        for m in modules:
            m.reshard()


@contextmanager
def zero3_gathered(engine: torch.nn.Module) -> Iterator[None]:
    """Gather a ZeRO-3 engine's parameters and take its hooks off, for plain passes through ``engine.module``.

    TRL's generation context does the same (``GatheredParameters`` + ``remove_hooks``) but leaves the root
    ``_start_of_forward_hook`` on, whose ``reset_step`` broadcasts while the ZeRO-3 trace is recorded (right
    after generation invalidated it): ranks making different numbers of passes then hang. That hook is taken off
    here too and put back first in line on exit, where TRL's ``add_hooks`` re-registers the module hooks.
    """
    import deepspeed
    from trl.models.utils import add_hooks, remove_hooks

    offload = getattr(engine.optimizer, "parameter_offload", engine.optimizer)
    module = engine.module
    with deepspeed.zero.GatheredParameters(list(module.parameters())):
        remove_hooks(engine)
        root = getattr(offload, "fwd_pre_hook", None)
        root_fn = module._forward_pre_hooks.pop(root.id, None) if root is not None else None
        try:
            yield
        finally:
            add_hooks(engine)
            if root_fn is not None:
                offload.fwd_pre_hook = module.register_forward_pre_hook(root_fn, prepend=True)


def max_over_ranks(n: int, group: dist.ProcessGroup | None = None) -> int:
    """The maximum of ``n`` over the ranks of ``group`` (all-reduce MAX); ``n`` without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return n
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    count = torch.tensor([n], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
    return int(count.item())


def pad_to_max_over_ranks(
    items: Sequence[T], dummy: T, group: dist.ProcessGroup | None = None
) -> Iterator[tuple[T, bool]]:
    """``(item, True)`` for each item, then ``(dummy, False)`` until every rank has yielded the same number.

    Every rank of ``group`` must call it (one all-reduce), also a rank with no items.
    """
    total = max_over_ranks(len(items), group)
    for i in range(total):
        yield (items[i], True) if i < len(items) else (dummy, False)


def dummy_probe(device: torch.device | str = "cpu", token_id: int = 0) -> tuple[torch.Tensor, ...]:
    """A valid ``[1, 4]`` outcome probe (2 reasoning tokens, 1 answer token) for padding scorer calls:
    ``(input_ids, attention_mask, reasoning_mask, answer_mask)``. Its scores are meaningless: discard them."""
    input_ids = torch.full((1, 4), token_id, dtype=torch.long, device=device)
    attention_mask = torch.ones(1, 4, dtype=torch.long, device=device)
    reasoning_mask = torch.tensor([[False, True, True, False]], device=device)
    answer_mask = torch.tensor([[False, False, False, True]], device=device)
    return input_ids, attention_mask, reasoning_mask, answer_mask


@contextmanager
def equal_scorer_calls(
    credit: ResolvedCredit, policy: torch.nn.Module, group: dist.ProcessGroup | None = None,
) -> Iterator[ResolvedCredit]:
    """Yields ``credit`` with a score function that counts its calls; on a normal exit, makes dummy calls on
    ``policy`` (a :func:`dummy_probe`, or a 1-row batch for a method without probe; results discarded, own
    random source) until this rank has made as many calls as the busiest rank of ``group``.

    Every rank of ``group`` must enter, also one with nothing to score. A method that samples continuations
    (``needs_rollout``) gets no dummy calls: it has no rollout to sample from outside a real batch.
    """
    method, options = credit
    calls: list[int] = []

    @functools.wraps(method.score)  # same signature: options and context still route to it
    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return method.score(*args, **kwargs)

    yield ResolvedCredit(replace(method, score=counted), options)
    if method.needs_rollout:
        return
    missing = max_over_ranks(len(calls), group) - len(calls)
    if missing <= 0:
        return
    device = next(policy.parameters()).device
    context: dict[str, Any] = {"generator": torch.Generator(device=device).manual_seed(0)}
    if method.needs_probe:
        args: tuple[Any, ...] = (policy, *dummy_probe(device))
    else:
        ids = torch.zeros(1, 2, dtype=torch.long, device=device)
        zero = torch.zeros(1, device=device)
        args = (CreditBatch(prompt_ids=ids, prompt_mask=torch.ones_like(ids), completion_ids=ids,
                            completion_mask=torch.ones_like(ids), advantages=zero, rewards=zero,
                            group=zero.long(), model=policy),)
        context.update(active=torch.ones(1, dtype=torch.bool, device=device), batch_size=1)
    for _ in range(missing):
        call_with_options(method.score, *args, options=options, **context)


def gather_rows(t: torch.Tensor, group: dist.ProcessGroup | None = None, left: bool = False,
                pad: float | int = 0) -> tuple[torch.Tensor, slice]:
    """Every rank's rows of ``t`` (``[b]`` or ``[b, L]``; ``b`` and ``L`` may differ between ranks) in rank order,
    padded with ``pad`` to the widest ``L`` (in front when ``left``, as left-padded prompts), and this rank's
    rows in the result. Every rank of ``group`` must call it; without a process group, ``t`` itself."""
    if not (dist.is_available() and dist.is_initialized()):
        return t, slice(0, t.shape[0])
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    shape = torch.tensor([t.shape[0], t.shape[1] if t.dim() > 1 else 0], dtype=torch.int64, device=t.device)
    shapes = [torch.empty_like(shape) for _ in range(world)]
    dist.all_gather(shapes, shape, group=group)
    rows = [int(s[0]) for s in shapes]
    width = max(int(s[1]) for s in shapes)
    x = t.to(torch.uint8) if t.dtype == torch.bool else t  # gloo gathers no bool
    if x.dim() > 1 and x.shape[1] < width:
        fill = x.new_full((x.shape[0], width - x.shape[1], *x.shape[2:]), pad)
        x = torch.cat([fill, x] if left else [x, fill], dim=1)
    if x.shape[0] < max(rows):
        x = torch.cat([x, x.new_full((max(rows) - x.shape[0], *x.shape[1:]), pad)])
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    full = torch.cat([p[:n] for p, n in zip(parts, rows, strict=True)]).to(t.dtype)
    start = sum(rows[:rank])
    return full, slice(start, start + rows[rank])


def group_token_credit(credit: ResolvedCredit, batch: CreditBatch, active: torch.Tensor,
                       group: dist.ProcessGroup | None = None, **kwargs: Any) -> TokenCredit:
    """:func:`oar.credit.token_credit` of a method that reads whole rollout groups, on a batch split over the ranks
    of ``group``: every rank's rows are gathered (prompts left-padded, completions right-padded to one width),
    scored together, and this rank's rows come back at its own width. ``batch.group`` must hold ids that are
    unique over all ranks (a group may span ranks); ``batch.rewards`` and ``active`` (``[b]`` bool) are this
    rank's. ``kwargs`` go to ``token_credit``. Every rank of ``group`` must call it."""
    def gather(t: torch.Tensor | None, left: bool = False) -> torch.Tensor | None:
        return None if t is None else gather_rows(t, group, left)[0]

    every, mine = gather_rows(active.bool(), group)
    full = CreditBatch(
        prompt_ids=gather(batch.prompt_ids, left=True), prompt_mask=gather(batch.prompt_mask, left=True),
        completion_ids=gather(batch.completion_ids), completion_mask=gather(batch.completion_mask),
        advantages=gather(batch.advantages), rewards=gather(batch.rewards), group=gather(batch.group),
        model=batch.model, tokenizer=batch.tokenizer,
    )
    whole = token_credit(credit, full, active=every, **kwargs)
    return whole.rows(mine, batch.completion_ids.shape[1])
