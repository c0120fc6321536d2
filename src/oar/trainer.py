"""TRL adapter: ``OARGRPOTrainer`` turns GRPO's sequence advantages into OAR per-token advantages.

The only module that knows TRL. Per rollout batch it calls TRL's own ``_generate_and_score_completions``,
builds the outcome probe for the completions whose advantage is non-zero, scores their reasoning tokens with
the unwrapped policy, reshapes the scores into Bi-Level weights and hands ``A[:, None] * w`` ([B, T]) back to
TRL's loss. TRL buffers the batch, so the weights are computed once and reused across ``num_iterations`` and
``steps_per_generation``, like the old log-probs.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from oar import checkpoints
from oar.checkpoints import STAGING_DIR
from oar.reshape import bilevel_weights, weight_stats

CREDITS = ("grpo", "oar-g", "oar-p", "entropy", "random")
PROBE_MODES = ("last", "answer_mean", "answer_joint")
ANSWER_SOURCES = ("completion", "reference")
# metric keys of weight_stats, logged as "oar/weight_<key>" (ess_ratio and gini keep their own name)
_STAT_KEYS = ("mean", "std", "max", "min", "frac_suppressed", "frac_floor", "ess_ratio", "gini")
_COUNT_KEYS = ("total", "scored", "uniform", "no_answer", "too_short", "nonfinite", "tokens")
logger = logging.getLogger(__name__)


@dataclass
class OARConfig(GRPOConfig):
    """``GRPOConfig`` plus the OAR knobs (OAR_SPEC defaults). Every field loads from YAML via ``TrlParser``."""

    credit: str = field(
        default="oar-g",
        metadata={"help": f"Token credit: one of {CREDITS}. 'grpo' = uniform weights (plain GRPO)."},
    )
    oar_tau: float = field(default=0.25, metadata={"help": "Bi-Level quantile level, in (0, 1)."})
    oar_beta: float = field(default=1.0, metadata={"help": "Bi-Level boost strength, >= 0."})
    oar_floor: float = field(default=0.1, metadata={"help": "Minimum weight of a suppressed token, in [0, 1]."})
    probe_mode: str | None = field(
        default=None,
        metadata={"help": f"How P_final is read: one of {PROBE_MODES}; None = the scorer's default "
                          "(oar-g: answer_mean, oar-p: last)."},
    )
    conclude_text: str = field(
        default="\n\nTherefore, the final answer is \\boxed{",
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
    noise_std: float = field(
        default=1e-3, metadata={"help": "OAR-G: std of the Gaussian noise on the reasoning embeddings, >= 0."}
    )
    oar_batch_size: int = field(
        default=16, metadata={"help": "Completions per importance-scorer call, >= 1 (bounds the probes' memory)."}
    )
    oar_chunk_size: int | None = field(
        default=None,
        metadata={"help": "OAR-P: perturbed positions per forward pass, >= 1; None = the scorer's default."},
    )
    oar_max_probe_length: int | None = field(
        default=None, metadata={"help": "Truncate probes longer than this (tokens); None = no limit."}
    )
    oar_dump_every: int = field(
        default=0,
        metadata={"help": "Append token-credit records to OUTPUT_DIR/attributions.jsonl every N rollout "
                          "batches (0 = never)."},
    )
    oar_dump_count: int = field(
        default=4, metadata={"help": "Completions per attribution dump, >= 1."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.credit not in CREDITS:
            raise ValueError(f"credit must be one of {CREDITS}, got {self.credit!r}")
        if self.probe_mode is not None and self.probe_mode not in PROBE_MODES:
            raise ValueError(f"probe_mode must be one of {PROBE_MODES} or None, got {self.probe_mode!r}")
        if self.answer_source not in ANSWER_SOURCES:
            raise ValueError(f"answer_source must be one of {ANSWER_SOURCES}, got {self.answer_source!r}")
        if not 0.0 < self.oar_tau < 1.0:
            raise ValueError(f"oar_tau must be in (0, 1), got {self.oar_tau!r}")
        if not self.oar_beta >= 0.0:
            raise ValueError(f"oar_beta must be >= 0, got {self.oar_beta!r}")
        if not 0.0 <= self.oar_floor <= 1.0:
            raise ValueError(f"oar_floor must be in [0, 1], got {self.oar_floor!r}")
        if not (self.noise_std >= 0.0 and math.isfinite(self.noise_std)):
            raise ValueError(f"noise_std must be a finite number >= 0, got {self.noise_std!r}")
        if self.credit == "oar-g" and self.noise_std == 0.0 and self.probe_mode != "answer_joint":
            raise ValueError("noise_std must be > 0 for credit='oar-g' unless probe_mode='answer_joint' "
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
        if self.args.credit != "grpo":
            if self.is_fsdp_enabled or (
                self.is_deepspeed_enabled and self.accelerator.state.deepspeed_plugin.zero_stage == 3
            ):
                raise ValueError(
                    f"credit={self.args.credit!r} scores tokens with the full policy on every rank; FSDP and "
                    "DeepSpeed ZeRO-3 shard it and are not supported yet (use ZeRO-2 or DDP, or credit='grpo')"
                )
            from oar.importance import get_scorer
            from oar.probe import OutcomeProbe

            self._probe = OutcomeProbe(
                self.processing_class if not hasattr(self.processing_class, "tokenizer")
                else self.processing_class.tokenizer,
                conclude=self.args.conclude_text,
                answer_source=self.args.answer_source,
                max_length=self.args.oar_max_probe_length,
            )
            self._scorer = get_scorer(self.args.credit)
        # OAR-G noise and the random baseline draw from their own generator: the rollout RNG stream stays
        # the same as plain GRPO's
        self._oar_generator = torch.Generator(device=self.accelerator.device)
        self._oar_generator.manual_seed(self.args.seed + 7919 * self.accelerator.process_index)
        self._oar_rollouts = 0

    # --- the one TRL hook ------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        if not self.model.training:  # evaluation: the loss is reported with plain GRPO advantages
            return output
        self._check_rewards(output["completion_ids"].shape[0])
        t0 = time.perf_counter()
        adv = output["advantages"]  # [B]
        weights, diag = self._token_weights(inputs, output)  # [B, T]
        output["advantages"] = adv[:, None] * weights.to(adv.dtype)
        self._log_oar_metrics(diag, time.perf_counter() - t0)
        self._oar_rollouts += 1
        return output

    # --- pieces ------------------------------------------------------------------------------------------
    def _scorer_kwargs(self) -> dict[str, Any]:
        a = self.args
        kw: dict[str, Any] = {}
        if a.probe_mode is not None and a.credit in ("oar-g", "oar-p"):
            kw["mode"] = a.probe_mode
        if a.credit == "oar-g":
            kw["noise_std"] = a.noise_std
        if a.credit in ("oar-g", "random"):
            kw["generator"] = self._oar_generator
        if a.credit == "oar-p" and a.oar_chunk_size is not None:
            kw["chunk_size"] = a.oar_chunk_size
        return kw

    def _token_weights(
        self, inputs: list[dict[str, Any]], output: dict[str, Any]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Weights ``[B, T]`` (1 on every non-reasoning token and every unscored row) and diagnostics."""
        completion_ids = output["completion_ids"]
        B, T = completion_ids.shape
        weights = torch.ones(B, T, dtype=torch.float32, device=completion_ids.device)
        counts = dict.fromkeys(_COUNT_KEYS, 0)
        counts["total"] = B
        diag: dict[str, Any] = {"counts": counts, "stats": None}
        active = (output["advantages"] != 0).nonzero().squeeze(1).tolist()
        if self.args.credit == "grpo" or not active:
            return weights, diag

        a = self.args
        model = self.accelerator.unwrap_model(self.model)  # the policy (through its adapter for PEFT), no DDP hooks
        w_rows, m_rows, s_rows, a_rows, rows = [], [], [], [], []
        for start in range(0, len(active), a.oar_batch_size):
            idx = active[start : start + a.oar_batch_size]
            sel = torch.tensor(idx, device=completion_ids.device)
            refs = [str(inputs[i][a.reference_column]) for i in idx] if a.answer_source == "reference" else None
            pb = self._probe.build(
                output["prompt_ids"][sel], output["prompt_mask"][sel],
                completion_ids[sel], output["completion_mask"][sel], references=refs,
            )
            scores = self._scorer(
                model, pb.input_ids, pb.attention_mask, pb.reasoning_mask, pb.answer_mask,
                **self._scorer_kwargs(),
            ).detach()
            comp_scores = pb.to_completion(scores).float()  # [b, T]
            mask = pb.completion_reasoning_mask & pb.valid[:, None]
            w = bilevel_weights(comp_scores, mask, a.oar_tau, a.oar_beta, a.oar_floor)
            weights[sel] = w
            nonfinite = torch.where(mask, ~torch.isfinite(comp_scores), False).any(dim=1)
            counts["scored"] += len(idx)
            counts["uniform"] += int(((w == 1) | ~mask).all(dim=1).sum())
            counts["no_answer"] += int(pb.no_answer.sum())
            counts["too_short"] += int((pb.too_short | pb.too_long).sum())
            counts["nonfinite"] += int(nonfinite.sum())
            counts["tokens"] += int(mask.sum())
            w_rows.append(w)
            m_rows.append(mask)
            s_rows.append(comp_scores)
            a_rows.append(pb.completion_answer_mask)
            rows.extend(idx)
        w_all, m_all = torch.cat(w_rows), torch.cat(m_rows)
        diag["stats"] = weight_stats(w_all, m_all)
        if a.oar_dump_every and self._oar_rollouts % a.oar_dump_every == 0 and self.accelerator.is_main_process:
            self._dump_attributions(inputs, output, rows, torch.cat(s_rows), w_all, m_all, torch.cat(a_rows))
        return weights, diag

    def _log_oar_metrics(self, diag: dict[str, Any], seconds: float) -> None:
        """Reduce the diagnostics over ranks (token-weighted means) and queue them for TRL's ``log``."""
        c, stats = diag["counts"], diag["stats"] or dict.fromkeys(_STAT_KEYS, 0.0)
        n_tok = float(c["tokens"])
        local = [float(c[k]) for k in _COUNT_KEYS] + [n_tok * stats[k] for k in _STAT_KEYS]
        local += [stats["max"] if n_tok else -math.inf, stats["min"] if n_tok else math.inf, seconds]
        g = self.accelerator.gather(torch.tensor(local, dtype=torch.float64, device=self.accelerator.device))
        g = g.view(self.accelerator.num_processes, -1)
        tot = dict(zip(_COUNT_KEYS, g[:, : len(_COUNT_KEYS)].sum(0).tolist(), strict=True))
        sums = g[:, len(_COUNT_KEYS) : len(_COUNT_KEYS) + len(_STAT_KEYS)].sum(0).tolist()
        m = self._metrics["train"]
        scored, tokens = tot["scored"], tot["tokens"]
        m["oar/frac_scored"].append(scored / max(tot["total"], 1.0))
        for k in ("uniform", "no_answer", "too_short", "nonfinite"):
            m[f"oar/frac_{k}"].append(tot[k] / scored if scored else 0.0)
        for k, s in zip(_STAT_KEYS, sums, strict=True):
            name = k if k in ("ess_ratio", "gini") else f"weight_{k}"
            if k == "max":
                value = g[:, -3].max().item() if tokens else 1.0
            elif k == "min":
                value = g[:, -2].min().item() if tokens else 1.0
            else:
                value = s / tokens if tokens else (1.0 if k in ("mean", "ess_ratio") else 0.0)
            m[f"oar/{name}"].append(value)
        m["oar/importance_time"].append(g[:, -1].max().item())

    def _dump_attributions(
        self, inputs: list[dict[str, Any]], output: dict[str, Any], rows: list[int], scores: torch.Tensor,
        weights: torch.Tensor, mask: torch.Tensor, answer: torch.Tensor,
    ) -> None:
        """Append ``oar_dump_count`` scored completions to ``OUTPUT_DIR/attributions.jsonl`` (``[b, T]`` tensors
        aligned with ``rows``, the completions' indices in ``output``)."""
        from oar.attribution import AttributionRecord, append_records, decode_tokens

        tok = getattr(self.processing_class, "tokenizer", self.processing_class)
        rewards = self._completion_rewards(output["completion_ids"].shape[0])
        records = []
        for j, i in enumerate(rows[: self.args.oar_dump_count]):
            n = int(output["completion_mask"][i].sum())
            prompt = inputs[i]["prompt"]
            records.append(AttributionRecord(
                tokens=decode_tokens(tok, output["completion_ids"][i, :n].tolist()),
                scores=scores[j, :n].tolist(),
                weights=weights[j, :n].tolist(),
                reasoning=mask[j, :n].tolist(),
                answer=answer[j, :n].tolist(),
                credit=self.args.credit,
                prompt=prompt if isinstance(prompt, str) else str(prompt[-1].get("content", "")),
                advantage=float(output["advantages"][i]),
                reward=rewards[i],
                step=self.state.global_step,
            ))
        os.makedirs(self.args.output_dir, exist_ok=True)
        append_records(os.path.join(self.args.output_dir, "attributions.jsonl"), records)

    def _completion_rewards(self, n: int) -> list[float | None]:
        """TRL's total reward (``reward_weights``-weighted sum) of this process's ``n`` completions of the latest
        rollout batch; None where no reward function scored one. TRL keeps only the per-function rewards, for
        all processes in rank order, in ``_logs["rewards"]`` (not in the batch it hands to the loss)."""
        p = self.accelerator.num_processes
        per_func = torch.tensor([list(self._logs["rewards"][name])[-n * p :] for name in self.reward_func_names])
        start = self.accelerator.process_index * n
        per_func = per_func[:, start : start + n]  # [F, n]
        total = (per_func * self.reward_weights.cpu()[:, None]).nansum(0)
        return [None if unscored else float(r) for r, unscored in zip(total, per_func.isnan().all(0), strict=True)]

    def _check_rewards(self, n: int) -> None:
        """Log ``oar/nonfinite_rewards`` (completions of the latest rollout batch, all ranks, whose reward is inf,
        or NaN from every reward function) and warn when there are any: TRL zeroes their advantages (an inf
        zeroes its whole group's), so they train on nothing."""
        p = self.accelerator.num_processes
        per_func = torch.tensor([list(self._logs["rewards"][name])[-n * p :] for name in self.reward_func_names])
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
