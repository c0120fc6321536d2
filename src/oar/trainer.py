"""TRL adapter: ``OARGRPOTrainer`` turns GRPO's sequence advantages into OAR per-token advantages.

With :mod:`oar.trl_rollout` (the batch's rewards, ``vine``'s sampler and grader), the only module that knows TRL.
Per rollout batch it calls TRL's own ``_generate_and_score_completions``, runs the configured credit
(:func:`oar.credit.token_credit`: e.g. the outcome probe of the completions whose advantage is non-zero, scored
with the policy's full weights, also under FSDP2 and ZeRO-3: :mod:`oar.distributed`, reshaped into Bi-Level
weights) and hands ``A[:, None] * w + δ`` ([B, T]) back to TRL's loss. TRL buffers the batch, so the credit is
computed once and reused across ``num_iterations`` and ``steps_per_generation``, like the old log-probs.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from oar import checkpoints
from oar.checkpoints import STAGING_DIR
from oar.credit import CreditBatch, CreditSpec, ResolvedCredit, TokenCredit, get_credit, token_credit
from oar.credit.metrics import gather_totals, metric_totals, metrics_from_totals
from oar.distributed import FSDP1_MESSAGE, equal_scorer_calls, full_policy, group_token_credit, sharding_of
from oar.probe import ANSWER_SOURCES, DEFAULT_CONCLUDE
from oar.ranges import check_finite_fields, check_range
from oar.trl_loss import chunking_blocker, loss_chunks, take_rows
from oar.trl_rollout import RolloutRewards

# deprecated OARConfig fields, each an alias of one credit option (write NAME@OPTION=VALUE into `credit` instead)
DEPRECATED_OPTION_FIELDS = {"oar_tau": "tau", "oar_beta": "beta", "oar_floor": "floor", "probe_mode": "mode",
                            "noise_std": "noise_std", "oar_chunk_size": "chunk_size"}
logger = logging.getLogger(__name__)
# TRL >= 1.x's _get_per_token_logps_and_entropies also returns the MoE router loss (TRL 1.0 returns two values)
_RETURNS_AUX_LOSS = "compute_aux_loss" in inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters


def _deprecated(option: str) -> dict[str, str]:
    return {"help": f"Deprecated alias of the credit option {option!r}: write it into credit as "
                    f"NAME@{option}=VALUE. Ignored by a credit without that option."}


@dataclass
class OARConfig(GRPOConfig):
    """Configuration of :class:`OARGRPOTrainer`: TRL's ``GRPOConfig`` plus OAR's token credit (OAR_SPEC's defaults).

    Every field loads from YAML via ``TrlParser``; an invalid value raises ``ValueError`` naming the field and its
    allowed range. Each field's ``help`` metadata says what it does: docs/training.md's field table is generated
    from it, theme by theme as listed here (``python -m oar.config_table``; a test keeps the page equal).

    ``credit`` names the method and its options in one value, ``NAME`` or ``NAME@OPT=VALUE&OPT=VALUE``
    (``oar-p@horizon=2&chunk_size=64``; ``oar credits`` lists every method and option). It is resolved once, here:
    after construction ``credit`` holds the canonical text (what ``run.json`` records) and ``resolved_credit`` the
    registered method with every option checked (type, range, finiteness, the method's rules) and defaults filled
    in. ``credit_options`` and the option fields are deprecated aliases (a ``FutureWarning``): they are merged into
    ``credit`` and then cleared. GRPO's sampling ``temperature`` is GRPO's alone; a credit that reads the policy's
    entropy at a temperature takes its own option (``gtpo@temperature=0.7``).

    Parameters:
        > Which token credit

        credit

        > Deprecated aliases of credit options (write NAME@OPT=VALUE into credit)

        credit_options, oar_tau, oar_beta, oar_floor, probe_mode, noise_std, oar_chunk_size

        > The outcome probe (OAR_SPEC §2)

        conclude_text, answer_source, reference_column, oar_max_probe_length

        > Cost of the scoring pass

        oar_batch_size

        > Rollouts

        oar_rollout_dtype, oar_fast_sampler

        > Speed and memory of the loss pass

        oar_share_prompt, oar_loss_batch_size

        > Token-credit dumps

        oar_dump_every, oar_dump_count
    """

    credit: str = field(
        default="oar-g",
        metadata={"help": "Token credit: NAME or NAME@OPT=VALUE&OPT=VALUE (e.g. oar-p@horizon=2&chunk_size=64): a "
                          "registered method (`oar credits`: grpo, oar-g, oar-p, oar-pg, oar-prefix, entropy, random, "
                          "entropy-mask, gtpo, ktae, cf-span, vine, vine-w) with its options, or a control "
                          "shuffle:NAME / inverted:NAME. 'grpo' = plain GRPO (uniform weights)."},
    )
    credit_options: dict | str | None = field(
        default=None,
        metadata={"help": "Deprecated: write the options into credit (NAME@OPT=VALUE). A dict or a JSON object "
                          "string, merged into credit's options (an option set both ways must agree)."},
    )
    oar_tau: float | None = field(default=None, metadata=_deprecated("tau"))
    oar_beta: float | None = field(default=None, metadata=_deprecated("beta"))
    oar_floor: float | None = field(default=None, metadata=_deprecated("floor"))
    probe_mode: str | None = field(default=None, metadata=_deprecated("mode"))
    conclude_text: str = field(
        default=DEFAULT_CONCLUDE,
        metadata={"help": "Text appended after the reasoning to elicit the final answer in the probe."},
    )
    answer_source: str = field(
        default="completion",
        metadata={"help": f"Answer tokens of the probe: one of {ANSWER_SOURCES} ('reference' reads "
                          "`reference_column` of the dataset row)."},
    )
    reference_column: str = field(
        default="answer", metadata={"help": "Dataset column holding the reference answer."}
    )
    noise_std: float | None = field(default=None, metadata=_deprecated("noise_std"))
    oar_batch_size: int = field(
        default=16, metadata={"help": "Completions per importance-scorer call, >= 1 (bounds the probes' memory)."}
    )
    oar_chunk_size: int | None = field(default=None, metadata=_deprecated("chunk_size"))
    oar_max_probe_length: int | None = field(
        default=None, metadata={"help": "Longest probe in tokens, >= 2: a longer one loses prompt tokens from the "
                                        "left (flag truncated); None = no limit."}
    )
    oar_dump_every: int = field(
        default=0,
        metadata={"help": "Every N rollout batches, append oar_dump_count scored completions' token credit "
                          "(tokens, scores, weights, TRL's total reward, the advantage) to "
                          "OUTPUT_DIR/attributions.jsonl (0 = never)."},
    )
    oar_dump_count: int = field(
        default=4, metadata={"help": "Completions per attribution dump, >= 1."}
    )
    oar_rollout_dtype: str | None = field(
        default=None,
        metadata={"help": "Sample the rollouts from a copy of the policy in this dtype (e.g. 'bfloat16'), synced "
                          "before every generation, with oar's sampler when sampling is plain (oar.sampling); the "
                          "loss still reads the policy. None = TRL's generate on the policy. One process only; "
                          "`oar train` sets it to bfloat16 on a CPU with fast bf16 matmuls."},
    )

    oar_fast_sampler: bool = field(
        default=False,
        metadata={"help": "Sample plain-sampling rollouts on the policy with oar's sampler (oar.sampling: each "
                          "distinct prompt prefilled once, inverse-CDF draws, finished rows leave the batch) instead "
                          "of transformers' generate (the rollout copy of oar_rollout_dtype always uses it). One "
                          "process without FSDP, ZeRO-3 or vLLM; `oar train` turns it on on a CPU."},
    )
    oar_share_prompt: bool = field(
        default=False,
        metadata={"help": "Compute the loss's log-probs with oar.teacher_forcing: the LM head on completion "
                          "positions only, in chunks, and each distinct prompt encoded once for the completions that "
                          "share it (the same quantity, other rounding: docs/results/lm_step.md). Applies in one "
                          "process to a plain causal LM (not FSDP, ZeRO-3, PEFT, gradient checkpointing or "
                          "multimodal inputs; TRL's pass otherwise); `oar train` turns it on on a CPU."},
    )
    oar_loss_batch_size: int | None = field(
        default=None,
        metadata={"help": "Completions per loss forward and backward, >= 1, a prompt's completions kept together "
                          "(bounds the loss's activation memory; the micro-batches' gradients sum to the batch's, "
                          "oar.trl_loss). None = the whole rollout batch at once, as TRL does. One process; `oar "
                          "train` sets 8 on a CPU."},
    )

    def __post_init__(self) -> None:
        check_finite_fields(self)  # before transformers' own checks, which crash on inf (int(inf) steps)
        super().__post_init__()
        spec = self._merged_credit()
        self.resolved_credit: ResolvedCredit = spec.resolve()
        self.credit, self.credit_options = str(spec), None
        for name in DEPRECATED_OPTION_FIELDS:
            setattr(self, name, None)
        self._note_temperature(spec)
        if self.answer_source not in ANSWER_SOURCES:
            raise ValueError(f"answer_source must be one of {ANSWER_SOURCES}, got {self.answer_source!r}")
        for name in ("oar_batch_size", "oar_dump_count"):
            check_range(name, getattr(self, name), ">= 1")
        if self.oar_loss_batch_size is not None:
            check_range("oar_loss_batch_size", self.oar_loss_batch_size, ">= 1")
        check_range("oar_dump_every", self.oar_dump_every, ">= 0")
        if self.oar_max_probe_length is not None:
            check_range("oar_max_probe_length", self.oar_max_probe_length, ">= 2")
        if not self.conclude_text:
            raise ValueError("conclude_text must be a non-empty string")
        if self.oar_rollout_dtype is not None and not isinstance(getattr(torch, str(self.oar_rollout_dtype), None),
                                                                 torch.dtype):
            raise ValueError(f"oar_rollout_dtype must name a torch dtype (e.g. 'bfloat16') or be None, "
                             f"got {self.oar_rollout_dtype!r}")

    def _merged_credit(self) -> CreditSpec:
        """``credit`` with the deprecated inputs merged in (one ``FutureWarning`` naming the replacement)."""
        spec = CreditSpec.parse(self.credit)
        try:
            method = get_credit(spec.name)
        except ValueError as err:  # listing the registered names
            raise ValueError(f"credit: {err}") from None
        used = []
        options = self.credit_options
        if isinstance(options, str):
            try:
                options = json.loads(options)
            except ValueError as err:
                raise ValueError(f"credit_options must be a JSON object, got {options!r}") from err
        if options is not None:
            if not isinstance(options, Mapping):
                raise ValueError(f"credit_options must be a dict or a JSON object, got {options!r}")
            spec = spec.merged(options, "credit_options")
            used.append("credit_options")
        for name, option in DEPRECATED_OPTION_FIELDS.items():
            value = getattr(self, name)
            if value is None:
                continue
            used.append(name)
            if option in method.options:
                method.specs[option].check(name, value)  # the field's name in the error
                spec = spec.merged({option: value}, name)
        if used:
            warnings.warn(f"OARConfig.{', OARConfig.'.join(used)} {'is' if len(used) == 1 else 'are'} deprecated and "
                          f"will be removed: write the options into the credit, credit={str(spec)!r}",
                          FutureWarning, stacklevel=4)
        return spec

    def _note_temperature(self, spec: CreditSpec) -> None:
        """Warn when the credit reads the policy at its own ``temperature`` option, left at its default, while
        GRPO samples at another (an older oar set that option from the sampler's temperature)."""
        declared = self.resolved_credit.method.options.get("temperature")
        if "temperature" in spec.options or declared is None or declared == self.temperature:
            return
        warnings.warn(f"credit {spec.name!r} reads the policy at its own temperature option ({declared}), not at "
                      f"GRPO's sampling temperature ({self.temperature}); write credit='{spec.name}@temperature="
                      f"{self.temperature}' (with its other options) to score at the sampling temperature",
                      UserWarning, stacklevel=4)


def stored_credit(config: Mapping[str, Any]) -> CreditSpec:
    """The credit a stored config (``run.json``'s ``"config"``) trained with, as one value: its ``credit`` plus,
    for a run of an older oar, its ``credit_options`` and option fields (those at their option's default left
    out), where GRPO's ``temperature`` also set a credit's ``temperature`` option."""
    spec = CreditSpec.parse(config.get("credit", "oar-g"))
    method = get_credit(spec.name)
    older = {option: config[name] for name, option in DEPRECATED_OPTION_FIELDS.items()
             if config.get(name) is not None and option in method.options}
    legacy = any(config.get(name) is not None for name in DEPRECATED_OPTION_FIELDS)  # this oar clears them
    if legacy and "temperature" in method.options and config.get("temperature") is not None:
        older["temperature"] = config["temperature"]  # an older oar routed the sampler's temperature
    older = {k: v for k, v in older.items() if v != method.options[k]}
    return CreditSpec(spec.name, {**older, **spec.options, **(config.get("credit_options") or {})})


@dataclass
class OARState:
    """What ``OARGRPOTrainer`` adds to a checkpoint (``oar_state_{rank}.pth``, :mod:`oar.checkpoints`): the
    generator the credit's random draws come from (OAR-G noise, the random baseline, the shuffle control; its own,
    so the rollout RNG stream stays plain GRPO's) and the count of rollout batches (paces ``oar_dump_every``)."""

    generator: torch.Generator
    rollouts: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "rollouts": int(self.rollouts)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.rollouts = int(state["rollouts"])


class OARGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with OAR token credit. Same constructor as TRL's; ``args`` must be an ``OARConfig``.

    Logs per step, next to TRL's metrics (:mod:`oar.credit.metrics`, the schema the verl plugin logs too):
    ``oar/weight_*`` (``weight_stats`` of the weights of the tokens acted on), ``oar/ess_ratio``, ``oar/gini``,
    ``oar/frac_scored`` (completions with non-zero advantage), ``oar/frac_uniform`` (scored completions left at
    uniform weights) and its causes ``oar/frac_no_answer``, ``oar/frac_too_short``, ``oar/frac_too_long``,
    ``oar/frac_nonfinite``; ``oar/importance_time`` (seconds per rollout batch, the slowest process),
    ``oar/importance_share`` (of the summed ``step_time``), ``oar/nonfinite_rewards`` and ``oar/grad_clipped``
    (1 when the logged step's ``grad_norm`` exceeded ``max_grad_norm``, i.e. clipping scaled the update down).

    Checkpoints are atomic: ``checkpoint-N`` is written into ``OUTPUT_DIR/.checkpoint-staging/`` and renamed into
    place once complete, so a ``checkpoint-N`` directory is never half-written. Each carries :class:`OARState`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._staging = False  # True while a checkpoint is written: ``_get_output_dir`` points into the staging dir
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, OARConfig):
            raise ValueError(f"OARGRPOTrainer needs args=OARConfig(...), got {type(self.args).__name__}")
        columns = getattr(self.train_dataset, "column_names", None)
        if self.args.answer_source == "reference" and columns is not None and self.args.reference_column not in columns:
            raise ValueError(f"answer_source='reference' reads reference_column={self.args.reference_column!r}, "
                             f"which the train dataset lacks; columns: {columns}")
        method = self.args.resolved_credit.method
        if method.needs_policy and self.is_fsdp_enabled and not self.accelerator.is_fsdp2:
            raise ValueError(f"credit={self.args.credit!r}: {FSDP1_MESSAGE}")
        self._probe = None
        if method.needs_probe:
            from oar.probe import OutcomeProbe

            self._probe = OutcomeProbe(
                getattr(self.processing_class, "tokenizer", self.processing_class),
                conclude=self.args.conclude_text,
                answer_source=self.args.answer_source,
                max_length=self.args.oar_max_probe_length,
            )
        generator = torch.Generator(device=self.accelerator.device)
        generator.manual_seed(self.args.seed + 7919 * self.accelerator.process_index)
        self.oar_state = OARState(generator)
        self._rewards: RolloutRewards | None = None  # the latest rollout batch's, from _calculate_rewards
        self._rollout_copy = None
        if self.args.oar_rollout_dtype is not None:
            if self.accelerator.num_processes > 1 or sharding_of(self.model_wrapped) is not None or self.use_vllm:
                raise ValueError("oar_rollout_dtype needs one process without FSDP, ZeRO-3 or vLLM (the copy is "
                                 "the whole policy); set it to None")
            from oar.sampling import RolloutCopy

            self._rollout_copy = RolloutCopy(self.accelerator.unwrap_model(self.model),
                                             getattr(torch, self.args.oar_rollout_dtype))
        if self.args.oar_fast_sampler and (self.accelerator.num_processes > 1 or self.use_vllm
                                           or sharding_of(self.model_wrapped) is not None):
            raise ValueError("oar_fast_sampler needs one process without FSDP, ZeRO-3 or vLLM; set it to false")
        self._loss_batch_size = self.args.oar_loss_batch_size
        if self._loss_batch_size is not None and (why := chunking_blocker(self)) is not None:
            logger.warning("oar: oar_loss_batch_size=%d is not used: the loss is computed on the whole batch with %s",
                           self._loss_batch_size, why)
            self._loss_batch_size = None

    # --- the one TRL hook ------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        with self._rollouts_from_copy():
            output = super()._generate_and_score_completions(inputs)
        if not self.model.training:  # evaluation: the loss is reported with plain GRPO advantages
            return output
        n = output["completion_ids"].shape[0]
        self._check_rewards(self._batch_rewards(n))
        t0 = time.perf_counter()
        credit = self._token_credit(inputs, output)
        sequence_advantages = output["advantages"]  # [B]
        output["advantages"] = credit.advantages(sequence_advantages)  # [B, T]
        self._log_oar_metrics(credit, time.perf_counter() - t0)
        if self.args.oar_dump_every and self.oar_state.rollouts % self.args.oar_dump_every == 0 \
                and self.accelerator.is_main_process and credit.flags["scored"].any():
            self._dump_attributions(inputs, output, credit, sequence_advantages)
        self.oar_state.rollouts += 1
        return output

    # --- pieces ------------------------------------------------------------------------------------------
    @contextmanager
    def _rollouts_from_copy(self) -> Iterator[None]:
        """With ``oar_rollout_dtype``: TRL's ``generate`` call on the policy is served by the rollout copy, synced
        with the policy's current weights first (:class:`oar.sampling.RolloutCopy`); with ``oar_fast_sampler``, by
        :func:`oar.sampling.generate` on the policy itself; otherwise nothing changes."""
        if self._rollout_copy is None and not self.args.oar_fast_sampler:
            yield
            return
        from oar import sampling

        policy = self.accelerator.unwrap_model(self.model)
        if self._rollout_copy is not None:
            self._rollout_copy.sync(policy)
            serve = self._rollout_copy.generate
        else:
            def serve(*args: Any, **kwargs: Any) -> torch.Tensor:
                return sampling.generate(policy, *args, **kwargs)
        policy.generate = serve  # an instance attribute, removed below
        try:
            yield
        finally:
            del policy.generate

    # --- the loss pass (oar.teacher_forcing, oar.trl_loss) ----------------------------------------------------
    def _get_per_token_logps_and_entropies(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                           logits_to_keep: int, batch_size: int | None = None,
                                           compute_entropy: bool = False, **kwargs: Any) -> tuple:
        """TRL's per-token log-probs and entropies ``[B, C]``; with ``oar_share_prompt``, where it applies, by
        :func:`oar.teacher_forcing.completion_logprobs` (completion positions only, shared prompts once)."""
        if not self._fast_pass_applies(model, logits_to_keep, input_ids.shape[1], kwargs):
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              batch_size, compute_entropy, **kwargs)
        from oar.teacher_forcing import completion_logprobs

        policy = self.accelerator.unwrap_model(model)
        step = batch_size or input_ids.shape[0]
        logps, entropies = [], []
        for s in range(0, input_ids.shape[0], step):
            with self.accelerator.autocast():
                lp, ent = completion_logprobs(policy, input_ids[s:s + step], attention_mask[s:s + step],
                                              logits_to_keep, temperature=self.temperature)
            logps.append(lp)
            entropies.append(ent)
        out = (torch.cat(logps), torch.cat(entropies) if compute_entropy else None)
        return (*out, None) if _RETURNS_AUX_LOSS else out

    def _fast_pass_applies(self, model: Any, logits_to_keep: int, width: int, extra: dict[str, Any]) -> bool:
        from oar.teacher_forcing import supports_fast_pass

        if not self.args.oar_share_prompt or width <= logits_to_keep or self.args.gradient_checkpointing:
            return False
        if any(v is not None and v is not False for v in extra.values()):  # multimodal inputs, the MoE aux loss
            return False
        if self.accelerator.num_processes > 1 or sharding_of(self.model_wrapped) is not None \
                or getattr(self, "_entropy_bonus_enabled", False) or getattr(self, "use_liger_kernel", False):
            return False
        policy = self.accelerator.unwrap_model(model)
        return not hasattr(policy, "peft_config") and supports_fast_pass(policy)

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> torch.Tensor:
        """TRL's loss; with ``oar_loss_batch_size``, in micro-batches of whole prompt groups (:mod:`oar.trl_loss`),
        each but the last run backward here with the scale the Trainer gives the returned loss."""
        chunks = None
        if self._loss_batch_size is not None and self.model.training:
            chunks = loss_chunks(inputs, self._loss_batch_size, self.loss_type)
        if chunks is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        scaled = getattr(self, "loss_is_scaled_for_ga", None)
        if scaled is None:  # the Trainer's own rule (transformers < 5.x without the attribute)
            scaled = (self.model_accepts_loss_kwargs and num_items_in_batch is not None) \
                or self.compute_loss_func is not None
        scale = 1.0 if scaled else 1.0 / self.current_gradient_accumulation_steps
        done = 0.0
        for i, (rows, weight) in enumerate(chunks):
            loss = super().compute_loss(model, take_rows(inputs, rows), return_outputs, num_items_in_batch) * weight
            if i + 1 == len(chunks):
                return loss + done
            self.accelerator.backward(loss * scale)
            done = done + loss.detach()
        raise AssertionError("unreachable")

    def _token_credit(self, inputs: list[dict[str, Any]], output: dict[str, Any]) -> TokenCredit:
        """This process's token credit of the rollout batch (completions with a non-zero advantage are scored).

        A method that reads the policy scores it with its full weights (FSDP2 / ZeRO-3: gathered once for the
        whole pass, :func:`oar.distributed.full_policy`), and every process makes the same number of scorer
        calls (light ones add dummy calls), so sharded collectives always pair up.
        """
        credit = self.args.resolved_credit
        if not credit.method.needs_policy:
            return self._credit_with(credit, None, inputs, output)
        if sharding_of(self.model_wrapped) is None:
            policy_ctx = nullcontext(self.accelerator.unwrap_model(self.model))  # the policy without DDP hooks
        else:
            policy_ctx = full_policy(self.model_wrapped)
        with policy_ctx as policy, equal_scorer_calls(credit, policy) as counted:
            return self._credit_with(counted, policy, inputs, output)

    def _credit_with(self, credit: ResolvedCredit, model: Any, inputs: list[dict[str, Any]],
                     output: dict[str, Any]) -> TokenCredit:
        a, m = self.args, credit.method
        adv = output["advantages"]
        n, rank = adv.shape[0], self.accelerator.process_index
        rollout = None
        if m.needs_rollout:  # vine: continuations from the policy, graded by reward_funcs
            from oar.trl_rollout import TRLContinuations

            rollout = TRLContinuations(self, inputs, model)
        batch = CreditBatch(
            prompt_ids=output["prompt_ids"], prompt_mask=output["prompt_mask"],
            completion_ids=output["completion_ids"], completion_mask=output["completion_mask"], advantages=adv,
            rewards=self._batch_rewards(n).local(rank, n).total().to(adv.device),
            group=(rank * n + torch.arange(n, device=adv.device)) // self.num_generations,  # TRL's layout
            model=model, rollout=rollout,
            tokenizer=getattr(self.processing_class, "tokenizer", self.processing_class),
        )
        refs = [str(row[a.reference_column]) for row in inputs] if a.answer_source == "reference" else None
        kwargs = dict(probe=self._probe, references=refs, batch_size=a.oar_batch_size,
                      generator=self.oar_state.generator)
        if m.needs_group:  # group statistics need whole groups: every process's rows, scored together
            return group_token_credit(credit, batch, adv != 0, **kwargs)
        tc = token_credit(credit, batch, active=adv != 0, **kwargs)
        if rollout is not None:
            self._log_rollout_cost(rollout.cost)
        return tc

    def _log_rollout_cost(self, cost: dict[str, int]) -> None:
        """Log what ``vine`` generated for this rollout batch, summed over ranks: ``oar/rollout_states`` (states
        sampled), ``oar/rollout_tokens`` (continuation tokens generated), ``oar/rollout_graded`` (completions
        graded) and ``oar/rollout_steps`` (steps per scored completion)."""
        keys = ("states", "tokens", "graded", "steps", "rows")
        tot = {k: float(v.sum()) for k, v in gather_totals({k: cost[k] for k in keys}, self.accelerator.gather,
                                                           self.accelerator.device).items()}
        m = self._metrics["train"]
        for k in ("states", "tokens", "graded"):
            m[f"oar/rollout_{k}"].append(tot[k])
        m["oar/rollout_steps"].append(tot["steps"] / tot["rows"] if tot["rows"] else 0.0)

    def _log_oar_metrics(self, credit: TokenCredit, seconds: float) -> None:
        """Reduce the credit's totals over ranks by name (:mod:`oar.credit.metrics`) and queue them for TRL's
        ``log``, with ``oar/importance_time`` (the slowest rank's seconds). Every rank logs the same keys,
        whatever it scored."""
        totals = {**metric_totals(credit.weights, credit.offsets, credit.mask, credit.flags), "seconds": seconds}
        every = gather_totals(totals, self.accelerator.gather, self.accelerator.device)
        m = self._metrics["train"]
        for key, value in metrics_from_totals(every).items():
            m[key].append(value)
        m["oar/importance_time"].append(every["seconds"].max().item())

    def _dump_attributions(self, inputs: list[dict[str, Any]], output: dict[str, Any], credit: TokenCredit,
                           sequence_advantages: torch.Tensor) -> None:
        """Append the first ``oar_dump_count`` scored completions to ``OUTPUT_DIR/attributions.jsonl``."""
        from oar.attribution import AttributionRecord, append_records, decode_tokens

        tok = getattr(self.processing_class, "tokenizer", self.processing_class)
        n_local = output["completion_ids"].shape[0]
        rewards = self._batch_rewards(n_local).local(self.accelerator.process_index, n_local).total().tolist()
        rows = credit.flags["scored"].nonzero().squeeze(1).tolist()[: self.args.oar_dump_count]
        records = []
        for i in rows:
            n = int(output["completion_mask"][i].sum())
            prompt = inputs[i]["prompt"]
            records.append(AttributionRecord(
                tokens=decode_tokens(tok, output["completion_ids"][i, :n].tolist()),
                scores=credit.scores[i, :n].tolist(),
                weights=credit.weights[i, :n].tolist(),
                reasoning=credit.mask[i, :n].tolist(),
                answer=credit.answer_mask[i, :n].tolist(),
                credit=self.args.credit,
                prompt=prompt if isinstance(prompt, str) else str(prompt[-1].get("content", "")),
                advantage=float(sequence_advantages[i]),
                reward=None if math.isnan(rewards[i]) else rewards[i],
                step=self.state.global_step,
                offsets=credit.offsets[i, :n].tolist() if credit.combine in ("add", "replace") else None,
            ))
        os.makedirs(self.args.output_dir, exist_ok=True)
        append_records(os.path.join(self.args.output_dir, "attributions.jsonl"), records)

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> torch.Tensor:
        """TRL's per-function rewards of the rollout batch (``[N, F]``, all processes, rank order), kept as the
        batch's :class:`oar.trl_rollout.RolloutRewards` for the credit methods that read rewards, the attribution
        dumps and the reward check."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards = RolloutRewards(rewards_per_func.detach().float().cpu().clone(),
                                       self.reward_weights.detach().float().cpu())
        return rewards_per_func

    def _batch_rewards(self, n_local: int) -> RolloutRewards:
        """The latest rollout batch's rewards, every process's ``n_local`` completions."""
        n = n_local * self.accelerator.num_processes
        if self._rewards is None or self._rewards.per_func.shape[0] != n:
            got = None if self._rewards is None else tuple(self._rewards.per_func.shape)
            raise RuntimeError(f"oar: expected the rewards of {n} completions from TRL's _calculate_rewards, got {got}")
        return self._rewards

    def _check_rewards(self, rewards: RolloutRewards) -> None:
        """Log ``oar/nonfinite_rewards`` (completions of the rollout batch, all ranks, whose reward is inf, or NaN
        from every reward function) and warn when there are any: TRL zeroes their advantages (an inf zeroes its
        whole group's), so they train on nothing."""
        bad = rewards.nonfinite()
        count = int(bad.sum())
        self._metrics["train"]["oar/nonfinite_rewards"].append(float(count))
        if count and self.accelerator.is_main_process:
            logger.warning(
                "oar: %d of %d completions in rollout batch %d (step %d) have a non-finite reward (inf or NaN); "
                "their advantages are zero%s. Check the reward functions %s.", count, bad.numel(),
                self.oar_state.rollouts, self.state.global_step,
                ": this batch trains on nothing" if count == bad.numel() else "", self.reward_func_names,
            )

    # --- atomic checkpoints with OAR's own state (oar.checkpoints) -----------------------------------------
    def _get_output_dir(self, trial: Any) -> str:
        run_dir = super()._get_output_dir(trial)
        return os.path.join(run_dir, STAGING_DIR) if self._staging else run_dir

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """TRL's checkpoint, written into the staging dir, then renamed to ``checkpoint-N`` and rotated."""
        def save_staged() -> None:
            self._staging = True
            try:
                super(OARGRPOTrainer, self)._save_checkpoint(model, trial)
            finally:
                self._staging = False

        checkpoints.save_atomic(self, trial, save_staged)

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        checkpoints.save_oar_state(self.oar_state, output_dir, self.accelerator.process_index)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        if checkpoint is not None:
            checkpoints.load_oar_state(self.oar_state, checkpoint, self.accelerator.process_index)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        m = self._metrics["train"]
        if self.model.training and m.get("step_time") and m.get("oar/importance_time"):
            logs["oar/importance_share"] = sum(m["oar/importance_time"]) / sum(m["step_time"])
        grad_norm = logs.get("grad_norm")
        if grad_norm is not None and self.args.max_grad_norm and self.args.max_grad_norm > 0:
            logs["oar/grad_clipped"] = float(grad_norm > self.args.max_grad_norm)
        super().log(logs, start_time)
