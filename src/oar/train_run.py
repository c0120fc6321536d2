"""``oar train`` as importable functions: its arguments, the trainer it builds, resume, training, the summary.

The pieces live in their own modules: the data (:mod:`oar.train_data`), the ``--config`` file check
(:mod:`oar.config_file`), the run directory (:mod:`oar.rundir`, written by :mod:`oar.rundir_callback`),
checkpoints and the final save (:mod:`oar.checkpoints`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from oar.checkpoints import checkpoint_dirs, checkpoint_step, resume_checkpoint, save_final_model
from oar.config_file import check_config_file
from oar.files import check_writable_dir
from oar.prompts import ANSWER_COLUMN, PROMPT_TEMPLATE, QUESTION_COLUMN, SOLUTION_COLUMN, check_template
from oar.rundir import RunDir
from oar.rundir_callback import RunDirCallback
from oar.train_data import format_train_dataset, read_train_dataset, split_worked_examples
from oar.trainer import DEPRECATED_OPTION_FIELDS, OARConfig, stored_credit


@dataclass
class TrainArguments:
    """What to train on (everything else is an ``OARConfig`` field)."""

    model: str | None = field(
        default=None, metadata={"help": "Hub id, local model directory, .gguf file, or 'smollm2'."}
    )
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file name inside --model (dir or repo)."})
    dtype: str | None = field(default=None, metadata={"help": "Model dtype (e.g. bfloat16); default: checkpoint's."})
    dataset: str | None = field(
        default=None, metadata={"help": "Hub dataset id, or a local .jsonl/.json/.parquet file or dataset dir."}
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    dataset_split: str = field(default="train", metadata={"help": "Dataset split to train on."})
    prompt_column: str = field(default=QUESTION_COLUMN, metadata={"help": "Column with the problem text."})
    answer_column: str = field(
        default=ANSWER_COLUMN, metadata={"help": "Column with the gold answer (a boxed solution or '#### n' is fine)."}
    )
    prompt_template: str = field(
        default=PROMPT_TEMPLATE, metadata={"help": "Prompt text; '{question}' is replaced by the problem."}
    )
    conversational: str = field(
        default="auto",
        metadata={"help": "Wrap prompts as a chat user turn: 'auto' (when the tokenizer has a chat template), "
                          "'true' or 'false'."},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N rows."})
    worked_examples: int = field(
        default=0, metadata={"help": "Show the first N rows, solved (--solution_column), before every problem "
                                     "(chat turns when conversational); they are not trained on."}
    )
    solution_column: str = field(
        default=SOLUTION_COLUMN, metadata={"help": "Column with a worked solution (for --worked_examples)."}
    )
    resume: bool = field(default=False, metadata={"help": "Continue from the last checkpoint in output_dir."})


def parse_train_args(argv: list[str]) -> tuple[TrainArguments, OARConfig]:
    """``[--config FILE.yaml] [--field value ...]`` -> arguments, with TRL's own parser (CLI overrides YAML).

    On a machine without CUDA the defaults become :func:`cpu_defaults` (any of them can still be set).
    """
    import torch
    from trl import TrlParser

    if "--config" in argv[:-1]:
        check_config_file(argv[argv.index("--config") + 1], (TrainArguments, OARConfig))
    parser = TrlParser([TrainArguments, OARConfig], prog="oar train")
    # oar train's live line, whatever transformers' log level (under quiet_libraries it would print log dicts)
    parser.set_defaults(disable_tqdm=False)
    if not torch.cuda.is_available():
        parser.set_defaults(**cpu_defaults())
    script_args, config = parser.parse_args_and_config(args=argv)
    check_steps(config)
    if script_args.max_train_samples is not None and script_args.max_train_samples < 1:
        raise ValueError(f"max_train_samples must be >= 1 (or unset: every row), got {script_args.max_train_samples}")
    if script_args.conversational not in ("auto", "true", "false"):
        raise ValueError(f"conversational must be 'auto', 'true' or 'false', got {script_args.conversational!r}")
    if isinstance(script_args.worked_examples, bool) or script_args.worked_examples < 0:
        raise ValueError(f"worked_examples must be >= 0, got {script_args.worked_examples}")
    check_template(script_args.prompt_template)
    return script_args, config


def cpu_defaults() -> dict[str, Any]:
    """``oar train``'s defaults on a CPU (docs/results/lm_step.md measures each): no gradient checkpointing (TRL's
    default recomputes every activation, for memory a CPU has); bf16 autocast over fp32 master weights where the
    CPU has fast bf16 matmuls (oneDNN: AVX512-BF16 or AMX; :func:`oar.cpu.fast_bf16`), which loses no update, unlike
    bf16 weights. In a single process also: rollouts sampled by oar's sampler (``oar_fast_sampler``), from a bf16
    copy of the policy where bf16 is fast (``oar_rollout_dtype``); the loss's passes with the head on completion
    positions and each group's prompt encoded once (``oar_share_prompt``), in micro-batches of 8 completions
    (``oar_loss_batch_size``: the loss's activations of 8 completions at a time, not the whole batch's)."""
    import os

    from oar.cpu import fast_bf16 as cpu_fast_bf16

    fast_bf16 = cpu_fast_bf16()
    one = int(os.environ.get("WORLD_SIZE", "1")) == 1
    return {"use_cpu": True, "bf16": fast_bf16, "gradient_checkpointing": False,
            "oar_rollout_dtype": "bfloat16" if fast_bf16 and one else None, "oar_fast_sampler": one,
            "oar_share_prompt": one, "oar_loss_batch_size": 8 if one else None}


def check_steps(config: OARConfig) -> None:
    """Step counts transformers would silently reinterpret: ``max_steps`` 0 or below -1 (it would train
    ``num_train_epochs`` instead), non-positive ``save_steps``/``logging_steps`` under the "steps" strategy."""
    if config.max_steps == 0 or config.max_steps < -1:
        raise ValueError(f"max_steps must be >= 1 (or -1: train num_train_epochs), got {config.max_steps}")
    for name, strategy in (("save_steps", "save_strategy"), ("logging_steps", "logging_strategy")):
        value = getattr(config, name)
        if str(getattr(getattr(config, strategy), "value", getattr(config, strategy))) == "steps" and not value > 0:
            raise ValueError(f"{name} must be > 0 with {strategy}='steps', got {value}")


class TrainProgressCallback(TrainerCallback):
    """``oar train``'s live line (main process; in place of transformers' tqdm bar and its printed log dicts):
    ``train  step/max_steps  bar  reward  s/step  scoring share  elapsed  ETA``."""

    def __init__(self) -> None:
        self.lines = None
        self.fields: dict[str, str] = {}

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero and not args.disable_tqdm:
            from oar.progress import ProgressLines

            self.lines = ProgressLines({"train": state.max_steps})
            self.lines.advance("train", state.global_step)  # resumed runs start where they stopped

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        for key, name, fmt in (("reward", "reward", "{:.3f}"), ("step_time", "s/step", "{:.2f}"),
                               ("oar/importance_share", "scoring", "{:.0%}")):
            if isinstance(logs.get(key), int | float):
                self.fields[name] = fmt.format(logs[key])

    def on_step_end(self, args, state, control, **kwargs):
        if self.lines is not None:
            self.lines.advance("train", **self.fields)

    def on_train_end(self, args, state, control, **kwargs):
        if self.lines is not None:
            self.lines.close()
            self.lines = None


# --- training ------------------------------------------------------------------------------------------


def build_trainer(script_args: TrainArguments, config: OARConfig, reward_funcs=None, callbacks=None):
    """Model, tokenizer, dataset and an ``OARGRPOTrainer`` writing the run directory (nothing trained yet)."""
    from oar.grading import math_reward
    from oar.models import load_model_and_tokenizer
    from oar.trainer import OARGRPOTrainer

    if not script_args.model:
        raise ValueError("no model: pass --model ID_OR_PATH or set `model:` in the --config file")
    if not script_args.dataset:
        raise ValueError("no dataset: pass --dataset ID_OR_PATH or set `dataset:` in the --config file")
    check_template(script_args.prompt_template)
    raw = read_train_dataset(  # every row checked before the model loads
        script_args.dataset, script_args.prompt_column, script_args.answer_column, script_args.dataset_split,
        script_args.dataset_config, script_args.max_train_samples,
    )
    examples, raw = split_worked_examples(raw, script_args.worked_examples, script_args.prompt_column,
                                          script_args.solution_column)
    model, tokenizer = load_model_and_tokenizer(script_args.model, dtype=script_args.dtype,
                                                gguf_file=script_args.gguf_file)
    conversational = script_args.conversational == "true" or (
        script_args.conversational == "auto" and getattr(tokenizer, "chat_template", None) is not None
    )
    dataset = format_train_dataset(raw, script_args.prompt_column, script_args.answer_column,
                                   script_args.prompt_template, conversational, examples)
    run_info = {"model": script_args.model, "dataset": script_args.dataset, "train_rows": len(dataset),
                "train_args": _train_args(script_args)}
    trainer = OARGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs or [math_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[RunDirCallback(run_info), *(callbacks or [])],
    )
    if not config.disable_tqdm:  # one live line instead of tqdm and the printed log dicts
        from transformers import ProgressCallback

        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(TrainProgressCallback())
    return trainer


def run_training(script_args: TrainArguments, config: OARConfig, reward_funcs=None,
                 callbacks=None) -> dict[str, Any]:
    """Train (or resume), save the final model into ``output_dir`` and return a summary of the run.

    Without ``resume`` an ``output_dir`` that already holds a run is refused (ValueError); with it, training
    continues from the newest intact checkpoint (:func:`oar.checkpoints.resume_checkpoint`: a damaged newer one is
    named on stderr and passed over; none intact is a ValueError), or starts fresh when there is none, provided
    the settings that shape training are the stored ones (:func:`check_resume`). A checkpoint already at
    ``max_steps`` (a kill during the final save) is not trained further: its model is saved as the final one.
    """
    out = Path(config.output_dir)
    check_writable_dir(out)
    if not script_args.resume and RunDir(out).is_run():
        raise ValueError(f"output_dir {str(out)!r} already holds a run; pass --resume to continue it "
                         "or choose another --output_dir")
    checkpoint = None
    if script_args.resume:
        check_resume(out, script_args, config)
        # the newest intact checkpoint; newer damaged ones are named on stderr, none intact is a ValueError
        checkpoint = resume_checkpoint(out, needs_training_state=not config.save_only_model)
    done = checkpoint is not None and config.max_steps > 0 and checkpoint_step(checkpoint) >= config.max_steps
    if done and checkpoint_step(checkpoint) > config.max_steps:
        raise ValueError(f"{checkpoint} is past max_steps={config.max_steps}; resume with --max_steps >= "
                         f"{checkpoint_step(checkpoint)}")
    trainer = build_trainer(script_args, config, reward_funcs=reward_funcs, callbacks=callbacks)
    if done:
        trainer._load_from_checkpoint(checkpoint)
        metrics: dict[str, Any] = {}
    else:
        metrics = trainer.train(resume_from_checkpoint=checkpoint).metrics
    save_final_model(trainer, config.output_dir)
    records = RunDir(out).metrics() if RunDir(out).is_run() else []
    return summarize_run(records, metrics, config, checkpoint)


# OARConfig fields a resumed run may change: how long it trains, what it logs, where and how often it saves
RESUMABLE_FIELDS = frozenset({
    "max_steps", "num_train_epochs", "output_dir", "resume_from_checkpoint", "save_steps", "save_strategy",
    "save_total_limit", "save_on_each_node", "logging_steps", "logging_strategy", "logging_first_step",
    "logging_dir", "log_level", "log_level_replica", "log_on_each_node", "log_completions",
    "num_completions_to_print", "report_to", "run_name", "project", "disable_tqdm", "push_to_hub", "hub_model_id",
    "hub_strategy", "hub_token", "hub_private_repo", "hub_always_push", "hub_revision", "local_rank", "ddp_timeout",
    "dataloader_num_workers", "dataloader_persistent_workers", "dataloader_pin_memory", "dataloader_prefetch_factor",
    "skip_memory_metrics", "oar_dump_every", "oar_dump_count", "trackio_space_id", "trackio_bucket_id",
    "trackio_static_space_id",
})


def _train_args(script_args: TrainArguments) -> dict[str, Any]:
    return {k: v for k, v in vars(script_args).items() if k != "resume"}


def check_resume(out: Path, script_args: TrainArguments, config: OARConfig) -> None:
    """ValueError naming every setting that differs from the run stored in ``out/run.json`` (model, dataset,
    data options and every ``OARConfig`` field outside :data:`RESUMABLE_FIELDS`), before anything loads; and
    naming ``run.json`` when ``out`` holds checkpoints but no ``run.json`` with the stored config (their settings
    cannot be checked)."""
    path = RunDir(out).run_json
    stored = None
    if path.is_file():
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot read {path} to check the resumed settings: {err}") from err
    if not (isinstance(stored, dict) and isinstance(stored.get("config"), dict)):
        if checkpoint_dirs(out):  # nothing to check them against
            why = "holds no stored config" if path.is_file() else "is missing"
            raise ValueError(f"--resume: {path} {why}, so the settings of the checkpoints in {str(out)!r} cannot be "
                             "checked; resume only a run oar train wrote, or choose another --output_dir")
        return
    old = stored["config"]
    new = json.loads(json.dumps(config.to_dict(), default=str))
    credit_keys = {"credit", "credit_options", *DEPRECATED_OPTION_FIELDS}  # one value, compared resolved below
    diffs = [f"{k}: {old[k]!r} -> {new[k]!r}" for k in sorted(old)
             if k in new and k not in RESUMABLE_FIELDS | credit_keys and old[k] != new[k]]
    was = stored_credit(old)  # a run of an older oar: its credit spread over several fields
    before, now = was.resolve(), config.resolved_credit
    if (before.method.name, before.options) != (now.method.name, now.options):
        diffs.insert(0, f"credit: {str(was)!r} -> {config.credit!r}")
    now = _train_args(script_args)
    before = stored.get("train_args", {"model": stored.get("model"), "dataset": stored.get("dataset")})
    diffs += [f"{k}: {before[k]!r} -> {now[k]!r}" for k in sorted(before) if k in now and before[k] != now[k]]
    if diffs:
        raise ValueError(f"--resume with settings that differ from the run in {str(out)!r} ({'; '.join(diffs)}); "
                         "resume with the stored settings (run.json) or choose another --output_dir")


def summarize_run(records: list[dict[str, Any]], train_metrics: dict[str, Any], config: OARConfig,
              resumed_from: str | None = None) -> dict[str, Any]:
    """Final numbers of a run from its ``metrics.jsonl`` records and TRL's ``train()`` metrics."""

    def mean(key: str, last: int | None = None, first: int | None = None) -> float | None:
        vals = [r[key] for r in records if isinstance(r.get(key), int | float)]
        vals = vals[-last:] if last else vals[:first] if first else vals
        return sum(vals) / len(vals) if vals else None

    return {
        "output_dir": config.output_dir,
        "credit": config.credit,
        "steps": max((r["step"] for r in records), default=0),
        "resumed_from": resumed_from,
        "train_runtime_s": train_metrics.get("train_runtime"),
        "reward_first": next((r["reward"] for r in records if isinstance(r.get("reward"), int | float)), None),
        "reward_first10": mean("reward", first=10),
        "reward_last10": mean("reward", 10),
        "step_time_mean_s": mean("step_time"),
        "importance_share_mean": mean("oar/importance_share"),
        "frac_uniform_mean": mean("oar/frac_uniform"),
        "grad_clipped_frac": mean("oar/grad_clipped"),
    }
