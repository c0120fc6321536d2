""":func:`token_credit`: one registered method run on a rollout batch, probe -> scores -> completion positions
-> weights or offsets. The trainer, ``oar attribute``, ``oar compare``, the verl plugin and the fidelity benchmark
all call it, so they agree by construction. Pure torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from oar.credit.batch import FLAG_KEYS, CreditBatch, TokenCredit
from oar.credit.options import call_with_options as _call
from oar.credit.registry import CreditMethod
from oar.credit.spec import CreditSpec, ResolvedCredit


def token_credit(
    method: str | CreditSpec | ResolvedCredit | CreditMethod,
    batch: CreditBatch,
    *,
    active: torch.Tensor | None = None,
    probe: Any = None,
    references: Sequence[str] | None = None,
    batch_size: int = 16,
    generator: torch.Generator | None = None,
    options: Mapping[str, Any] | None = None,
) -> TokenCredit:
    """Run a credit method on a rollout batch: probe -> scores -> completion positions -> weights or offsets.

    Args:
        method: a credit (``"oar-g"``, ``"oar-p@horizon=2"``, ``"shuffle:oar-g"``, a :class:`CreditSpec`), one
            already resolved (:meth:`CreditSpec.resolve`: its options are used as they are) or a
            :class:`CreditMethod`.
        batch: the rollout batch; ``batch.model`` is required when the method ``needs_policy``, ``group`` and
            ``rewards`` when it ``needs_group``, ``rollout`` when it ``needs_rollout``. A method that does not act
            (``grpo``) scores nothing: weights 1, no row scored.
        active: ``[B]`` bool, the rows to score (e.g. non-zero advantage); default all. Inactive rows get
            weight 1 and offset 0; group methods still read them as part of their group.
        probe: an :class:`oar.probe.OutcomeProbe` (required when the method ``needs_probe``).
        references: one reference answer per row, for a probe built with ``answer_source="reference"``.
        batch_size: rows per scorer call (rows are sorted by completion length first, so a call pays little
            padding). ``generator``: the random source of the scorer and of the controls.
        options: method options (see ``get_credit(name).options``), added to those the credit names (an option
            set both ways with different values, or undeclared, is a ValueError).

    Returns:
        A :class:`TokenCredit`; ``credit.advantages(A)`` is what the loss consumes.
    """
    if isinstance(method, ResolvedCredit):
        if options:
            raise ValueError("token_credit: a resolved credit carries its options; pass options= with a name")
        m, opts = method
    elif isinstance(method, CreditMethod):
        m, opts = method, method.check_options(options or {})
    else:
        m, opts = CreditSpec.parse(method).merged(options or {}, "options=").resolve()
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ids, cmask = batch.completion_ids, batch.completion_mask.bool()
    B, T = ids.shape
    device = ids.device
    active = torch.ones(B, dtype=torch.bool, device=device) if active is None else active.bool().to(device)
    if active.shape != (B,):
        raise ValueError(f"active must be [B] = [{B}], got {tuple(active.shape)}")
    if not m.acts:  # nothing to score: weights 1, no row counted as scored
        active = torch.zeros_like(active)
    if m.needs_policy and batch.model is None:
        raise ValueError(f"credit {m.name!r} needs the policy: CreditBatch.model is None")
    if m.needs_probe and probe is None:
        raise ValueError(f"credit {m.name!r} needs an outcome probe (probe=OutcomeProbe(tokenizer))")
    if m.needs_group and (batch.group is None or batch.rewards is None):
        raise ValueError(f"credit {m.name!r} needs the rollout group: CreditBatch.group and .rewards")
    if m.needs_rollout and batch.rollout is None:
        raise ValueError(f"credit {m.name!r} needs CreditBatch.rollout: an oar.credit.peers.vine.Continuations that "
                         "samples from the policy and grades with the reward (OARGRPOTrainer builds one)")

    scores = torch.zeros(B, T, dtype=torch.float32, device=device)
    mask = torch.zeros(B, T, dtype=torch.bool, device=device)
    answer = torch.zeros(B, T, dtype=torch.bool, device=device)
    flags = {k: torch.zeros(B, dtype=torch.bool, device=device) for k in FLAG_KEYS}
    flags["scored"] = active.clone()
    rows = active.nonzero().squeeze(1)
    rows = rows[torch.argsort(cmask[rows].sum(dim=1), stable=True)]  # similar lengths share a scorer call
    if m.needs_probe:
        for i in range(0, rows.numel(), batch_size):
            _probe_chunk(m, batch, rows[i : i + batch_size], probe, references, opts, generator, scores, mask,
                         answer, flags)
    elif rows.numel():
        s = _call(m.score, batch, options=opts, generator=generator, active=active,
                  batch_size=batch_size, probe=probe).float()
        mask = active[:, None] & cmask
        scores = torch.where(mask, s, torch.zeros_like(s))
    flags["nonfinite"] = torch.where(mask, ~torch.isfinite(scores), False).any(dim=1)
    weights, offsets = credit_effect(m, scores, mask, options=opts, generator=generator, batch=batch, probe=probe)
    flags["uniform"] = active & (((weights == 1) & (offsets == 0)) | ~mask).all(dim=1)
    return TokenCredit(m.name, m.combine, weights, offsets, scores, mask, answer, flags)


def credit_effect(m: CreditMethod, scores: torch.Tensor, mask: torch.Tensor, *, options: Mapping[str, Any],
                  generator: torch.Generator | None = None, batch: CreditBatch | None = None,
                  probe: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The method's effect on ``scores [B, T]`` over the masked tokens of the whole batch, as ``(weights,
    offsets)`` ``[B, T]`` float32 (weights 1 and offsets 0 off ``mask``); ``A[:, None] · weights + offsets`` are
    the token advantages. ``options`` are the method's checked options (``m.check_options``); ``batch`` (its
    advantages, completions, tokenizer) and ``probe`` reach an effect that names them."""
    effect = _call(m.effect, scores, mask, options=options, generator=generator, batch=batch, probe=probe).float()
    if m.combine in ("add", "replace"):
        offsets = torch.where(mask, effect, torch.zeros_like(effect))
        one = 0.0 if m.combine == "replace" else 1.0
        weights = torch.where(mask, torch.full_like(effect, one), torch.ones_like(effect))
    else:
        weights = torch.where(mask, effect, torch.ones_like(effect))
        offsets = torch.zeros_like(effect)
    return weights, offsets


def _probe_chunk(m: CreditMethod, batch: CreditBatch, idx: torch.Tensor, probe: Any,
                 references: Sequence[str] | None, opts: Mapping[str, Any], generator: Any,
                 scores: torch.Tensor, mask: torch.Tensor, answer: torch.Tensor,
                 flags: dict[str, torch.Tensor]) -> None:
    """Score rows ``idx`` on their outcome probes and write the results into the ``[B, T]`` outputs."""
    refs = [references[i] for i in idx.tolist()] if references is not None else None
    pb = probe(batch.prompt_ids[idx], batch.prompt_mask[idx], batch.completion_ids[idx],
                     batch.completion_mask[idx], references=refs)
    if pb.valid.any():
        s = _call(m.score, batch.model, pb.input_ids, pb.attention_mask, pb.reasoning_mask, pb.answer_mask,
                  options=opts, generator=generator, probe=probe).detach()
    else:
        s = torch.zeros(pb.input_ids.shape, device=pb.input_ids.device)
    keep = pb.completion_reasoning_mask & pb.valid[:, None]
    scores[idx] = pb.to_completion(s.float()).masked_fill(~keep, 0.0)
    mask[idx] = keep
    answer[idx] = pb.completion_statement_mask
    for k in ("no_answer", "too_short", "too_long", "truncated"):
        flags[k][idx] = getattr(pb, k)
