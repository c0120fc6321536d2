"""TRL adapter: ``OARGRPOTrainer`` turns GRPO's sequence advantages into OAR per-token advantages.

With :mod:`oar.trl_rollout` (``vine``'s sampler and grader), the only module that knows TRL. Per rollout batch it
calls TRL's own ``_generate_and_score_completions``, builds the outcome probe for the completions whose advantage
is non-zero, scores their reasoning tokens with the policy (its full weights, also under FSDP2 and ZeRO-3:
:mod:`oar.distributed`), reshapes the scores into Bi-Level weights and hands ``A[:, None] * w`` ([B, T]) back to
TRL's loss. TRL buffers the batch, so the weights are computed once and reused across ``num_iterations`` and
``steps_per_generation``, like the old log-probs.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from oar import checkpoints
from oar.checkpoints import STAGING_DIR
from oar.credit import CreditBatch, CreditMethod, TokenCredit, get_credit, token_credit
from oar.credit.metrics import metric_totals, metrics_from_totals
from oar.distributed import FSDP1_MESSAGE, equal_scorer_calls, full_policy, sharding_of
from oar.probe import ANSWER_SOURCES, DEFAULT_CONCLUDE
from oar.ranges import check_range
from oar.reshape import BETA, BETA_RANGE, FLOOR, FLOOR_RANGE, TAU, TAU_RANGE

PROBE_MODES = ("last", "answer_mean", "answer_joint")
# OARConfig fields handed to a credit method as these options, when the method declares them
_OPTION_FIELDS = {"tau": "oar_tau", "beta": "oar_beta", "floor": "oar_floor", "mode": "probe_mode",
                  "noise_std": "noise_std", "chunk_size": "oar_chunk_size", "temperature": "temperature"}
logger = logging.getLogger(__name__)


@dataclass
class OARConfig(GRPOConfig):
    """Configuration of :class:`OARGRPOTrainer`: TRL's ``GRPOConfig`` plus the fields below (OAR_SPEC's defaults).

    Every field loads from YAML via ``TrlParser``; an invalid value raises ``ValueError`` naming the field and its
    allowed range. Each field's ``help`` metadata says what it does: docs/training.md's field table is generated
    from it, theme by theme as listed here (``python -m oar.config_table``; a test keeps the page equal).

    Parameters:
        > Which token credit

        credit, credit_options

        > Options of the credit method as fields (credit_options wins where both set one)

        oar_tau, oar_beta, oar_floor, probe_mode, noise_std, oar_chunk_size

        > The outcome probe (OAR_SPEC §2)

        conclude_text, answer_source, reference_column, oar_max_probe_length

        > Cost of the scoring pass

        oar_batch_size

        > Token-credit dumps

        oar_dump_every, oar_dump_count
    """

    credit: str = field(
        default="oar-g",
        metadata={"help": "Token credit: a registered method (oar.credit.credit_names(): grpo, oar-g, oar-p, "
                          "entropy, random, entropy-mask, gtpo, ktae, cf-span, vine, ...) or a control shuffle:NAME / "
                          "inverted:NAME. 'grpo' = uniform weights (plain GRPO)."},
    )
    credit_options: dict | str | None = field(
        default=None,
        metadata={"help": "Options of the credit method (a dict, or a JSON object string), e.g. {\"rho\": 0.2}; "
                          "the method declares them (oar.credit.get_credit(name).options). They override the "
                          "oar_tau/oar_beta/oar_floor/probe_mode/noise_std/oar_chunk_size fields."},
    )
    oar_tau: float = field(default=TAU, metadata={"help": "Bi-Level quantile level, in (0, 1)."})
    oar_beta: float = field(default=BETA, metadata={"help": "Bi-Level boost strength, >= 0."})
    oar_floor: float = field(default=FLOOR, metadata={"help": "Minimum weight of a suppressed token, in [0, 1]."})
    probe_mode: str | None = field(
        default=None,
        metadata={"help": f"How P_final is read: one of {PROBE_MODES}; None = the scorer's default "
                          "(oar-g: answer_joint, oar-p: last)."},
    )
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
    noise_std: float | None = field(
        default=None, metadata={"help": "OAR-G: std of the Gaussian noise on the reasoning embeddings, >= 0; None = "
                                        "the scorer's default (0 with answer_joint, 1e-3 with the KL modes)."}
    )
    oar_batch_size: int = field(
        default=16, metadata={"help": "Completions per importance-scorer call, >= 1 (bounds the probes' memory)."}
    )
    oar_chunk_size: int | None = field(
        default=None,
        metadata={"help": "OAR-P: perturbed positions per forward pass, >= 1; None = the scorer's default."},
    )
    oar_max_probe_length: int | None = field(
        default=None, metadata={"help": "Longest probe in tokens: a longer one loses prompt tokens from the left "
                                        "(flag truncated); None = no limit."}
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

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.credit_options, str):
            try:
                self.credit_options = json.loads(self.credit_options)
            except ValueError as err:
                raise ValueError(f"credit_options must be a JSON object, got {self.credit_options!r}") from err
        if self.credit_options is not None and not isinstance(self.credit_options, dict):
            raise ValueError(f"credit_options must be a dict or a JSON object, got {self.credit_options!r}")
        try:
            method = get_credit(self.credit)
        except ValueError as err:
            raise ValueError(f"credit: {err}") from None
        if self.probe_mode is not None and self.probe_mode not in PROBE_MODES:
            raise ValueError(f"probe_mode must be one of {PROBE_MODES} or None, got {self.probe_mode!r}")
        if self.answer_source not in ANSWER_SOURCES:
            raise ValueError(f"answer_source must be one of {ANSWER_SOURCES}, got {self.answer_source!r}")
        check_range("oar_tau", self.oar_tau, TAU_RANGE)
        check_range("oar_beta", self.oar_beta, BETA_RANGE)
        check_range("oar_floor", self.oar_floor, FLOOR_RANGE)
        if self.noise_std is not None and not (self.noise_std >= 0.0 and math.isfinite(self.noise_std)):
            raise ValueError(f"noise_std must be a finite number >= 0, got {self.noise_std!r}")
        opts = self.method_options(method)
        base = method.base or method.name
        guide = {"oar-g": "mode", "oar-pg": "guide_mode"}.get(base)  # the option holding OAR-G's outcome mode
        if guide and opts["noise_std"] == 0.0 and opts[guide] != "answer_joint":
            raise ValueError(f"noise_std must be > 0 for credit={base!r} unless its {guide} is 'answer_joint' "
                             "(the KL outcome has zero gradient without noise)")
        for name in ("oar_batch_size", "oar_chunk_size", "oar_dump_count"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value!r}")
        if self.oar_dump_every < 0:
            raise ValueError(f"oar_dump_every must be >= 0 (0 = off), got {self.oar_dump_every!r}")
        if self.oar_max_probe_length is not None and self.oar_max_probe_length < 2:
            raise ValueError(f"oar_max_probe_length must be >= 2 or None, got {self.oar_max_probe_length!r}")
        if not self.conclude_text:
            raise ValueError("conclude_text must be a non-empty string")
        if self.oar_rollout_dtype is not None and not isinstance(getattr(torch, str(self.oar_rollout_dtype), None),
                                                                 torch.dtype):
            raise ValueError(f"oar_rollout_dtype must name a torch dtype (e.g. 'bfloat16') or be None, "
                             f"got {self.oar_rollout_dtype!r}")

    def method_options(self, method: Any = None) -> dict[str, Any]:
        """The credit method's options: its declared defaults, then the matching OAR fields, then
        ``credit_options``; ValueError naming an option the method does not declare or a value its declaration
        refuses (``oar_beta must be >= 0, got -1``, ``credit 'oar-g': beta must be >= 0, got -1``)."""
        method = method or get_credit(self.credit)
        fields_ = {k: getattr(self, f) for k, f in _OPTION_FIELDS.items()
                   if k in method.options and getattr(self, f) is not None}
        for k, value in fields_.items():  # the option's declaration, the field's name in the error
            if k in method.specs:
                method.specs[k].check(_OPTION_FIELDS[k], value)
        return method.check_options({**fields_, **(self.credit_options or {})})


class OARGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with OAR token credit. Same constructor as TRL's; ``args`` must be an ``OARConfig``.

    Logs per step, next to TRL's metrics: ``oar/weight_*`` (``weight_stats`` of the reasoning-token weights),
    ``oar/ess_ratio``, ``oar/gini``, ``oar/frac_scored`` (completions with non-zero advantage),
    ``oar/frac_uniform`` (scored completions left at uniform weights) and its causes ``oar/frac_no_answer``,
    ``oar/frac_too_short``, ``oar/frac_nonfinite``, ``oar/importance_time`` (seconds per rollout batch),
    ``oar/importance_share`` (of the summed ``step_time``) and ``oar/grad_clipped`` (1 when the logged step's
    ``grad_norm`` exceeded ``max_grad_norm``, i.e. clipping scaled the update down).

    Checkpoints are atomic: ``checkpoint-N`` is written into ``OUTPUT_DIR/.checkpoint-staging/`` and renamed into
    place once complete, so a ``checkpoint-N`` directory is never half-written.
    """

    _oar_staging = False  # True while a checkpoint is being written: ``_get_output_dir`` points into the staging dir

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, OARConfig):
            raise ValueError(f"OARGRPOTrainer needs args=OARConfig(...), got {type(self.args).__name__}")
        columns = getattr(self.train_dataset, "column_names", None)
        if self.args.answer_source == "reference" and columns is not None and self.args.reference_column not in columns:
            raise ValueError(f"answer_source='reference' reads reference_column={self.args.reference_column!r}, "
                             f"which the train dataset lacks; columns: {columns}")
        self._credit = get_credit(self.args.credit)
        self._credit_options = self.args.method_options(self._credit)
        if self._credit.needs_policy and self.is_fsdp_enabled and not self.accelerator.is_fsdp2:
            raise ValueError(f"credit={self.args.credit!r}: {FSDP1_MESSAGE}")
        self._probe = None
        if self._credit.needs_probe:
            from oar.probe import OutcomeProbe

            self._probe = OutcomeProbe(
                getattr(self.processing_class, "tokenizer", self.processing_class),
                conclude=self.args.conclude_text,
                answer_source=self.args.answer_source,
                max_length=self.args.oar_max_probe_length,
            )
        # OAR-G noise and the random baseline draw from their own generator: the rollout RNG stream stays
        # the same as plain GRPO's
        self._oar_generator = torch.Generator(device=self.accelerator.device)
        self._oar_generator.manual_seed(self.args.seed + 7919 * self.accelerator.process_index)
        self._oar_rollouts = 0
        self._rollout_copy = None
        if self.args.oar_rollout_dtype is not None:
            if self.accelerator.num_processes > 1 or sharding_of(self.model_wrapped) is not None or self.use_vllm:
                raise ValueError("oar_rollout_dtype needs one process without FSDP, ZeRO-3 or vLLM (the copy is "
                                 "the whole policy); set it to None")
            from oar.sampling import RolloutCopy

            self._rollout_copy = RolloutCopy(self.accelerator.unwrap_model(self.model),
                                             getattr(torch, self.args.oar_rollout_dtype))

    # --- the one TRL hook ------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        with self._rollouts_from_copy():
            output = super()._generate_and_score_completions(inputs)
        if not self.model.training:  # evaluation: the loss is reported with plain GRPO advantages
            return output
        self._check_rewards(output["completion_ids"].shape[0])
        t0 = time.perf_counter()
        credit = self._token_credit(inputs, output)
        sequence_advantages = output["advantages"]  # [B]
        output["advantages"] = credit.advantages(sequence_advantages)  # [B, T]
        self._log_oar_metrics(credit, time.perf_counter() - t0)
        if self.args.oar_dump_every and self._oar_rollouts % self.args.oar_dump_every == 0 \
                and self.accelerator.is_main_process and credit.flags["scored"].any():
            self._dump_attributions(inputs, output, credit, sequence_advantages)
        self._oar_rollouts += 1
        return output

    # --- pieces ------------------------------------------------------------------------------------------
    @contextmanager
    def _rollouts_from_copy(self) -> Iterator[None]:
        """With ``oar_rollout_dtype``: TRL's ``generate`` call on the policy is served by the rollout copy, synced
        with the policy's current weights first (:class:`oar.sampling.RolloutCopy`); otherwise nothing changes."""
        if self._rollout_copy is None:
            yield
            return
        policy = self.accelerator.unwrap_model(self.model)
        self._rollout_copy.sync(policy)
        policy.generate = self._rollout_copy.generate  # an instance attribute, removed below
        try:
            yield
        finally:
            del policy.generate

    def _token_credit(self, inputs: list[dict[str, Any]], output: dict[str, Any]) -> TokenCredit:
        """This process's token credit of the rollout batch (completions with a non-zero advantage are scored).

        A method that reads the policy scores it with its full weights (FSDP2 / ZeRO-3: gathered once for the
        whole pass, :func:`oar.distributed.full_policy`), and every process makes the same number of scorer
        calls (light ones add dummy calls), so sharded collectives always pair up.
        """
        m = self._credit
        if not m.needs_policy:
            return self._credit_with(m, None, inputs, output)
        if sharding_of(self.model_wrapped) is None:
            policy_ctx = nullcontext(self.accelerator.unwrap_model(self.model))  # the policy without DDP hooks
        else:
            policy_ctx = full_policy(self.model_wrapped)
        with policy_ctx as policy, equal_scorer_calls(m, policy, self._credit_options) as counted:
            return self._credit_with(counted, policy, inputs, output)

    def _credit_with(self, m: CreditMethod, model: Any, inputs: list[dict[str, Any]],
                     output: dict[str, Any]) -> TokenCredit:
        a = self.args
        adv = output["advantages"]
        rollout = rewards = None
        if getattr(m.score, "needs_rollout", False):  # vine: continuations from the policy, graded by reward_funcs
            from oar.trl_rollout import TRLContinuations

            rollout = TRLContinuations(self, inputs, model)
            n, p = adv.shape[0], self.accelerator.num_processes
            start = self.accelerator.process_index * n
            rewards = torch.tensor(self._rollout_rewards(n * p)[start : start + n], device=adv.device)
        batch = CreditBatch(
            prompt_ids=output["prompt_ids"], prompt_mask=output["prompt_mask"],
            completion_ids=output["completion_ids"], completion_mask=output["completion_mask"], advantages=adv,
            model=model, rollout=rollout, rewards=rewards,
            tokenizer=getattr(self.processing_class, "tokenizer", self.processing_class),
        )
        refs = [str(row[a.reference_column]) for row in inputs] if a.answer_source == "reference" else None
        kwargs = dict(probe=self._probe, references=refs, batch_size=a.oar_batch_size,
                      generator=self._oar_generator, options=self._credit_options)
        if m.name == "grpo":  # nothing to score: weights 1, logged as 0 completions scored
            return token_credit(m, batch, active=torch.zeros_like(adv, dtype=torch.bool), **kwargs)
        if not m.needs_group:
            credit = token_credit(m, batch, active=adv != 0, **kwargs)
            if rollout is not None:
                self._log_rollout_cost(rollout.cost)
            return credit
        # group statistics need whole groups: score the gathered rollout batch, keep this process's rows
        full = self._gathered_batch(batch)
        credit = token_credit(m, full, active=full.advantages != 0, **kwargs)
        n, start = adv.shape[0], self.accelerator.process_index * adv.shape[0]
        T = batch.completion_ids.shape[1]
        sl = slice(start, start + n)
        local = {k: getattr(credit, k)[sl, :T] for k in ("weights", "offsets", "scores", "mask", "answer_mask")}
        return TokenCredit(credit.method, credit.combine, **local,
                           flags={k: v[sl] for k, v in credit.flags.items()})

    def _gathered_batch(self, batch: CreditBatch) -> CreditBatch:
        """The rollout batch of every process (padded to one length), with TRL's rewards and group ids."""
        acc = self.accelerator

        def gather(t: torch.Tensor, left: bool = False) -> torch.Tensor:
            if acc.num_processes == 1:
                return t
            return acc.gather(acc.pad_across_processes(t, dim=1, pad_index=0, pad_first=left))

        adv = acc.gather(batch.advantages) if acc.num_processes > 1 else batch.advantages
        n = adv.shape[0]
        rewards = torch.tensor(self._rollout_rewards(n), dtype=torch.float32, device=adv.device)
        group = torch.arange(n, device=adv.device) // self.num_generations
        return CreditBatch(
            prompt_ids=gather(batch.prompt_ids, left=True), prompt_mask=gather(batch.prompt_mask, left=True),
            completion_ids=gather(batch.completion_ids), completion_mask=gather(batch.completion_mask),
            advantages=adv, rewards=rewards, group=group, model=batch.model,
        )

    def _log_rollout_cost(self, cost: dict[str, int]) -> None:
        """Log what ``vine`` generated for this rollout batch, summed over ranks: ``oar/rollout_states`` (states
        sampled), ``oar/rollout_tokens`` (continuation tokens generated), ``oar/rollout_graded`` (completions
        graded) and ``oar/rollout_steps`` (steps per scored completion)."""
        keys = ("states", "tokens", "graded", "steps", "rows")
        local = torch.tensor([float(cost[k]) for k in keys], dtype=torch.float64, device=self.accelerator.device)
        tot = dict(zip(keys, self.accelerator.gather(local).view(-1, len(keys)).sum(0).tolist(), strict=True))
        m = self._metrics["train"]
        for k in ("states", "tokens", "graded"):
            m[f"oar/rollout_{k}"].append(tot[k])
        m["oar/rollout_steps"].append(tot["steps"] / tot["rows"] if tot["rows"] else 0.0)

    def _log_oar_metrics(self, credit: TokenCredit, seconds: float) -> None:
        """Reduce the diagnostics over ranks (:mod:`oar.credit.metrics`: the schema the verl plugin logs too) and
        queue them for TRL's ``log``, with ``oar/importance_time`` (the slowest rank's seconds). Every rank logs
        the same keys, whatever it scored."""
        local = metric_totals(credit.weights, credit.offsets, credit.mask, credit.flags) + [seconds]
        g = self.accelerator.gather(torch.tensor(local, dtype=torch.float64, device=self.accelerator.device))
        g = g.view(self.accelerator.num_processes, -1)
        m = self._metrics["train"]
        for key, value in metrics_from_totals(g[:, :-1]).items():
            m[key].append(value)
        m["oar/importance_time"].append(g[:, -1].max().item())

    def _dump_attributions(self, inputs: list[dict[str, Any]], output: dict[str, Any], credit: TokenCredit,
                           sequence_advantages: torch.Tensor) -> None:
        """Append the first ``oar_dump_count`` scored completions to ``OUTPUT_DIR/attributions.jsonl``."""
        from oar.attribution import AttributionRecord, append_records, decode_tokens

        tok = getattr(self.processing_class, "tokenizer", self.processing_class)
        n_local = output["completion_ids"].shape[0]
        p, start = self.accelerator.num_processes, self.accelerator.process_index * n_local
        rewards = self._rollout_rewards(n_local * p)[start : start + n_local]
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
        """TRL's per-function rewards of the rollout batch (``[N, F]``, all processes, rank order), kept on the
        trainer for the credit methods that read rewards, the attribution dumps and the reward check."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._oar_rewards_per_func = rewards_per_func.detach().float().cpu().clone()
        return rewards_per_func

    def _rewards_per_func(self, n: int) -> torch.Tensor:
        """``[F, n]``: the latest rollout batch's rewards per reward function (``n``: all processes' completions)."""
        per_func = getattr(self, "_oar_rewards_per_func", None)
        if per_func is None or per_func.shape[0] != n:
            raise RuntimeError(f"oar: expected the rewards of {n} completions from TRL's _calculate_rewards, got "
                               f"{None if per_func is None else tuple(per_func.shape)}")
        return per_func.T

    def _rollout_rewards(self, n: int) -> list[float]:
        """TRL's total reward (``reward_weights``-weighted sum) of the latest rollout batch's ``n`` completions
        (all processes, rank order); NaN where no reward function scored one."""
        per_func = self._rewards_per_func(n)
        total = (per_func * self.reward_weights.cpu()[:, None]).nansum(0)
        return [float("nan") if unscored else float(r)
                for r, unscored in zip(total, per_func.isnan().all(0), strict=True)]

    def _check_rewards(self, n: int) -> None:
        """Log ``oar/nonfinite_rewards`` (completions of the latest rollout batch, all ranks, whose reward is inf,
        or NaN from every reward function) and warn when there are any: TRL zeroes their advantages (an inf
        zeroes its whole group's), so they train on nothing."""
        per_func = self._rewards_per_func(n * self.accelerator.num_processes)
        bad = per_func.isinf().any(0) | per_func.isnan().all(0)  # [n * p]
        count = int(bad.sum())
        self._metrics["train"]["oar/nonfinite_rewards"].append(float(count))
        if count and self.accelerator.is_main_process:
            logger.warning(
                "oar: %d of %d completions in rollout batch %d (step %d) have a non-finite reward (inf or NaN); "
                "their advantages are zero%s. Check the reward functions %s.", count, bad.numel(),
                self._oar_rollouts, self.state.global_step,
                ": this batch trains on nothing" if count == bad.numel() else "", self.reward_func_names,
            )

    # --- atomic checkpoints with OAR's own state (oar.checkpoints) -----------------------------------------
    def _get_output_dir(self, trial: Any) -> str:
        run_dir = super()._get_output_dir(trial)
        return os.path.join(run_dir, STAGING_DIR) if self._oar_staging else run_dir

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """TRL's checkpoint, written into the staging dir, then renamed to ``checkpoint-N`` and rotated."""
        checkpoints.save_atomic(self, trial, lambda: super(OARGRPOTrainer, self)._save_checkpoint(model, trial))

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        checkpoints.save_oar_state(self, output_dir)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        if checkpoint is not None:
            checkpoints.load_oar_state(self, checkpoint)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        m = self._metrics["train"]
        if self.model.training and m.get("step_time") and m.get("oar/importance_time"):
            logs["oar/importance_share"] = sum(m["oar/importance_time"]) / sum(m["step_time"])
        grad_norm = logs.get("grad_norm")
        if grad_norm is not None and self.args.max_grad_norm and self.args.max_grad_norm > 0:
            logs["oar/grad_clipped"] = float(grad_norm > self.args.max_grad_norm)
        super().log(logs, start_time)

