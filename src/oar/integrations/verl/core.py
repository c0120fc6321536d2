"""The framework-free half of the verl plugin: its config block, the actor-side scoring of one data-parallel
shard, and the driver-side fold into the advantages over the whole batch. Pure torch (verl is not imported), so
it is tested in oar's own environment; :mod:`oar.integrations.verl.trainer` wires it into verl.

Flow per step (verl v1 trainer): after the old log-probs, the driver marks the rows of mixed-reward groups
(:func:`active_rows`); every actor rank scores its shard with the policy (:func:`score_shard`: full weights,
scorer calls padded to the data-parallel max) and returns raw per-token scores; after GRPO's advantages, the
driver applies the method's effect to the scores of the whole batch at once (:func:`fold_credit`: Bi-Level
weights keep each completion's advantage mass; batch-level effects see the whole batch, never a micro-batch; the
``step`` and ``process`` rules read which response tokens end a step, marked by the actors, :func:`step_end_tokens`)
and logs the metric schema of :mod:`oar.credit.metrics` (``METRIC_KEYS``: the same keys every step, and the
same as TRL's trainer logs). A method that reads whole rollout groups (``gtpo``, ``ktae``) gets each row's
group id and reward: the actor ranks gather their shards and score them together
(:func:`oar.distributed.group_token_credit`), and the driver's effect reads the groups of the whole batch.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.distributed as dist

from oar.credit import CreditBatch, CreditSpec, ResolvedCredit, credit_effect, token_credit
from oar.credit.metrics import metric_totals, metrics_from_totals
from oar.distributed import equal_scorer_calls, full_policy, group_token_credit
from oar.probe import DEFAULT_CONCLUDE
from oar.ranges import check_range
from oar.steps import step_ends


@dataclass(frozen=True)
class OARVerlConfig:
    """The ``oar:`` block of a verl config (``+oar.credit=oar-g`` etc. on the command line; verl's own config
    dataclasses reject unknown keys, so OAR's knobs live in their own top-level block).

    ``credit``: the credit and its options in one value, ``NAME`` or ``NAME@OPT=VALUE&OPT=VALUE``
    (``+oar.credit='oar-g@mode=answer_mean&noise_std=0.001'``; :class:`oar.credit.CreditSpec`), resolved and
    checked here, before any worker starts; afterwards it holds the canonical text and ``resolved`` the method
    and its options. ``options``: deprecated (a ``FutureWarning``), merged into ``credit``. ``batch_size``:
    completions per scorer call (bounds the scorer's memory). ``conclude_text``: the probe's conclusion prompt.
    ``max_probe_length``: truncate longer probes (tokens). ``seed``: the scorer's random source (OAR-G noise),
    offset per data-parallel rank and step.
    """

    credit: str = "oar-g"
    options: Mapping[str, Any] = field(default_factory=dict)
    batch_size: int = 16
    conclude_text: str = DEFAULT_CONCLUDE
    max_probe_length: int | None = None
    seed: int = 0
    resolved: ResolvedCredit = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        spec = CreditSpec.parse(self.credit)
        if self.options:
            spec = spec.merged(dict(self.options), "oar.options")
            warnings.warn(f"oar.options is deprecated: write the options into the credit, +oar.credit='{spec}'",
                          FutureWarning, stacklevel=3)
        resolved = spec.resolve()  # ValueError naming an unknown credit, option or value, or a refused combination
        if resolved.method.needs_rollout:
            raise ValueError(f"oar.credit={str(spec)!r} samples continuations from the policy, which the verl plugin "
                             "does not do; use the TRL trainer (oar train) or a method without rollout")
        if resolved.method.lab_only:
            raise ValueError(f"oar.credit={str(spec)!r} is lab-only (it reads the arithmetic lab's ground truth)")
        object.__setattr__(self, "credit", str(spec))
        object.__setattr__(self, "options", {})
        object.__setattr__(self, "resolved", resolved)
        check_range("oar.batch_size", self.batch_size, ">= 1")
        if self.max_probe_length is not None:
            check_range("oar.max_probe_length", self.max_probe_length, ">= 2")
        if not self.conclude_text:
            raise ValueError("oar.conclude_text must be a non-empty string")

    @classmethod
    def from_mapping(cls, block: Mapping[str, Any] | None) -> OARVerlConfig:
        """From the config's ``oar`` block (a dict or an OmegaConf node; None = defaults); ValueError naming an
        unknown key."""
        block = dict(block or {})
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(block) - known)
        if unknown:
            raise ValueError(f"unknown oar config key(s) {unknown}; valid: {sorted(known)}")
        if "options" in block:
            block["options"] = dict(block["options"] or {})
        return cls(**block)

    def to_dict(self) -> dict[str, Any]:
        """Plain types only (travels to the workers in the batch's metadata): the credit as one value."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init and f.name != "options"}


def active_rows(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: rows whose sequence reward differs from their group's mean, i.e. GRPO's advantage is
    non-zero (rows of all-equal groups are not scored). rewards: ``[B]`` float; group: ``[B]`` long ids."""
    if rewards.shape != group.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group {tuple(group.shape)} must both be [B]")
    _, inverse = torch.unique(group, return_inverse=True)
    n = torch.zeros(int(inverse.max()) + 1 if inverse.numel() else 0, dtype=torch.float64, device=rewards.device)
    n = n.index_add(0, inverse, torch.ones_like(rewards, dtype=torch.float64))
    total = torch.zeros_like(n).index_add(0, inverse, rewards.double())
    return ~torch.isclose(rewards.double(), (total / n)[inverse], rtol=0.0, atol=1e-6)


def score_shard(
    cfg: OARVerlConfig, model: torch.nn.Module, tokenizer: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
    response_ids: torch.Tensor, response_mask: torch.Tensor, active: torch.Tensor,
    generator: torch.Generator | None = None, group: dist.ProcessGroup | None = None,
    group_ids: torch.Tensor | None = None, rewards: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Actor side: raw scores ``[b, T]`` and the tokens they cover ``[b, T]`` bool for this rank's shard.

    ``model``: the actor module as the engine holds it (FSDP2 or plain; FSDP1 is refused). Prompts ``[b, P]``
    in any padding side, responses ``[b, T]`` right-padded, masks 0/1; ``active``: ``[b]`` bool. Every rank of
    ``group`` (the data-parallel group) must call it: the policy is gathered once and the scorer calls are
    padded to the busiest rank. ``group_ids`` (``[b]`` long, unique over the whole batch) and ``rewards``
    (``[b]``): each row's rollout group and sequence reward, required by a method that reads whole groups, whose
    shards are gathered over ``group`` and scored together.
    """
    m = cfg.resolved.method
    if m.needs_group and (group_ids is None or rewards is None):
        raise ValueError(f"oar.credit={cfg.credit!r} reads whole rollout groups: pass group_ids and rewards")
    probe = None
    if m.needs_probe:
        from oar.probe import OutcomeProbe

        probe = OutcomeProbe(tokenizer, conclude=cfg.conclude_text, max_length=cfg.max_probe_length)
    with full_policy(model) as policy, equal_scorer_calls(cfg.resolved, policy, group) as counted:
        if "rule" in counted.options:  # the effect runs on the driver (fold_credit), where the advantages are; here
            # the rule that reads nothing but the scores stands in (its weights are not returned)
            counted = ResolvedCredit(counted.method, {**counted.options, "rule": "bilevel"})
        batch = CreditBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=response_ids,
                            completion_mask=response_mask, rewards=rewards, group=group_ids,
                            model=policy if m.needs_policy else None, tokenizer=tokenizer)
        kwargs = dict(probe=probe, batch_size=cfg.batch_size, generator=generator)
        if m.needs_group:
            credit = group_token_credit(counted, batch, active, group, **kwargs)
        else:
            credit = token_credit(counted, batch, active=active, **kwargs)
    return credit.scores, credit.mask


def step_end_tokens(cfg: OARVerlConfig, tokenizer: Any, response_ids: torch.Tensor,
                    response_mask: torch.Tensor) -> torch.Tensor:
    """Actor side: ``[b, T]`` bool, the response tokens that end a step (:mod:`oar.steps`: the credit's
    ``boundary_ids``, or its ``separator`` resolved by the actor's tokenizer) when the credit's reshaping rule groups
    by steps (``step``, ``process``); all False otherwise. The driver holds no tokenizer: it folds with these."""
    options = cfg.resolved.options
    if options.get("rule") not in ("step", "process"):
        return torch.zeros(response_ids.shape, dtype=torch.bool, device=response_ids.device)
    ends = step_ends(options["separator"], options["boundary_ids"], tokenizer, response_ids.device)
    return response_mask.bool() & torch.isin(response_ids, ends)


def fold_credit(
    cfg: OARVerlConfig, advantages: torch.Tensor, response_mask: torch.Tensor, scores: torch.Tensor,
    mask: torch.Tensor, active: torch.Tensor, generator: torch.Generator | None = None,
    group_ids: torch.Tensor | None = None, rewards: torch.Tensor | None = None, ends: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Driver side: token advantages ``[B, T]`` and the step's metrics (keys :data:`oar.credit.metrics.METRIC_KEYS`).

    ``advantages``: GRPO's ``[B, T]`` (the sequence advantage on every response token; its sign is what the ``sign``
    and ``process`` rules read); ``scores`` / ``mask``: the actor's output for the whole batch; ``active``: ``[B]``
    bool; ``group_ids`` / ``rewards`` (``[B]``): required by a method that reads whole groups; ``ends``: ``[B, T]``
    bool, the actors' :func:`step_end_tokens`, required by the ``step`` and ``process`` rules. The method's effect
    runs once over the whole batch; where it does not act (``~mask``) the advantages are unchanged.
    """
    m, options = cfg.resolved
    if not (advantages.shape == response_mask.shape == scores.shape == mask.shape):
        raise ValueError(f"advantages {tuple(advantages.shape)}, response_mask {tuple(response_mask.shape)}, "
                         f"scores {tuple(scores.shape)} and mask {tuple(mask.shape)} must all be [B, T]")
    if m.needs_group and (group_ids is None or rewards is None):
        raise ValueError(f"oar.credit={cfg.credit!r} reads whole rollout groups: pass group_ids and rewards")
    mask = mask.bool() & response_mask.bool() & active.bool()[:, None]
    # what an effect reads (the tokens stay on the actors): the sequence advantages, the groups and rewards, and for
    # the step rules which tokens end a step (as ids 1, with boundary_ids (1,))
    tokens = torch.zeros_like(response_mask).long()
    if options.get("rule") in ("step", "process"):
        if ends is None or ends.shape != response_mask.shape:
            raise ValueError(f"oar.credit={cfg.credit!r}: rule {options['rule']!r} groups by steps: pass ends, the "
                             "actors' step_end_tokens [B, T]")
        tokens, options = ends.long().to(response_mask.device), {**options, "boundary_ids": (1,)}
    rmask = response_mask.to(advantages.dtype)
    sequence = (advantages * rmask).sum(dim=1) / rmask.sum(dim=1).clamp_min(1)
    none = torch.zeros(advantages.shape[0], 0, dtype=torch.long, device=advantages.device)
    batch = CreditBatch(prompt_ids=none, prompt_mask=none, completion_ids=tokens, completion_mask=response_mask,
                        advantages=sequence, rewards=rewards, group=group_ids)
    weights, offsets = credit_effect(m, scores.float(), mask, options=options, generator=generator, batch=batch)
    folded = advantages * weights.to(advantages.dtype) + offsets.to(advantages.dtype)
    folded = folded * response_mask.to(advantages.dtype)
    uniform = active & (((weights == 1) & (offsets == 0)) | ~mask).all(dim=1)
    nonfinite = torch.where(mask, ~torch.isfinite(scores), False).any(dim=1)
    # the probe's row flags (no_answer, too_short, too_long) stay on the actor ranks: counted 0 here
    flags = {"scored": active.bool(), "uniform": uniform, "nonfinite": nonfinite}
    metrics = metrics_from_totals(metric_totals(weights, offsets, mask, flags))
    return folded, metrics

