"""Everything ``oar train`` does, as importable functions: arguments, dataset, run directory, resume, training.

Run directory (read by ``oar compare`` and ``oar report``)::

    RUN_DIR/run.json           {"credit", "seed", "model", "dataset", ..., "config": {...}, "summary": {...}}
    RUN_DIR/metrics.jsonl      one JSON object per logging step: "step", "wall_time" (s since training start,
                               continued across resumes) and every logged key (TRL's and "oar/...")
    RUN_DIR/attributions.jsonl token-credit dumps (``oar_dump_every > 0``)
    RUN_DIR/checkpoint-N/      TRL checkpoints, renamed into place when complete; ``--resume`` continues from the last
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from oar.files import atomic_write, read_jsonl
from oar.prompts import PROMPT_TEMPLATE, check_template, fill_template
from oar.trainer import OARConfig

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
FINAL_STAGING = ".model-staging"


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
    prompt_column: str = field(default="problem", metadata={"help": "Column with the problem text."})
    answer_column: str = field(
        default="answer", metadata={"help": "Column with the gold answer (a boxed solution or '#### n' is fine)."}
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
    resume: bool = field(default=False, metadata={"help": "Continue from the last checkpoint in output_dir."})


def parse_train_args(argv: list[str]) -> tuple[TrainArguments, OARConfig]:
    """``[--config FILE.yaml] [--field value ...]`` -> arguments, with TRL's own parser (CLI overrides YAML).

    On a machine without CUDA the defaults become ``use_cpu=True, bf16=False``.
    """
    import torch
    from trl import TrlParser

    parser = TrlParser([TrainArguments, OARConfig], prog="oar train")
    if not torch.cuda.is_available():
        parser.set_defaults(use_cpu=True, bf16=False)
    script_args, config = parser.parse_args_and_config(args=argv)
    if script_args.conversational not in ("auto", "true", "false"):
        raise ValueError(f"conversational must be 'auto', 'true' or 'false', got {script_args.conversational!r}")
    check_template(script_args.prompt_template)
    return script_args, config


# --- dataset -------------------------------------------------------------------------------------------


def _gold(value: Any) -> str:
    """A gold answer as text: the last boxed expression of a worked solution, else ``normalize_gold``."""
    from oar.answer_span import locate_answer
    from oar.grading import normalize_gold

    if isinstance(value, str) and "\\boxed" in value:
        span = locate_answer(value, phrases=())
        if span is not None:
            value = span.answer(value)
    return normalize_gold(value)


def load_train_dataset(
    source: str,
    prompt_column: str = "problem",
    answer_column: str = "answer",
    prompt_template: str = "{question}",
    conversational: bool = False,
    split: str = "train",
    config_name: str | None = None,
    max_samples: int | None = None,
):
    """A ``datasets.Dataset`` with the columns ``prompt`` (text, or a one-turn chat) and ``answer`` (gold text).

    ``source``: a local .jsonl/.json/.parquet file or dataset directory, else a hub id. FileNotFoundError for a
    missing local path, ValueError naming a missing column.
    """
    import datasets

    path = Path(source).expanduser()
    looks_local = path.suffix in (".jsonl", ".json", ".parquet") or source.startswith(("/", ".", "~"))
    if path.is_file():
        fmt = "parquet" if path.suffix == ".parquet" else "json"
        ds = datasets.load_dataset(fmt, data_files=str(path), split="train")
    elif path.is_dir():
        ds = datasets.load_from_disk(str(path)) if (path / "dataset_info.json").is_file() \
            else datasets.load_dataset(str(path), split=split)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
    elif looks_local:
        raise FileNotFoundError(f"dataset file {source!r} does not exist")
    else:
        ds = datasets.load_dataset(source, config_name, split=split)
    for role, col in (("prompt_column", prompt_column), ("answer_column", answer_column)):
        if col not in ds.column_names:
            raise ValueError(f"dataset {source!r} has no column {col!r} ({role}); columns: {ds.column_names}")
    if max_samples is not None:
        ds = ds.select(range(min(max_samples, len(ds))))

    def convert(row: dict[str, Any]) -> dict[str, Any]:
        text = fill_template(prompt_template, str(row[prompt_column]))
        prompt = [{"role": "user", "content": text}] if conversational else text
        return {"prompt": prompt, "answer": _gold(row[answer_column])}

    return ds.map(convert, remove_columns=ds.column_names)


# --- run directory -------------------------------------------------------------------------------------


def write_json_atomic(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON to ``path``, atomically."""
    atomic_write(path, json.dumps(data, indent=2, default=str))


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunDirCallback(TrainerCallback):
    """Writes ``run.json`` and ``metrics.jsonl`` into ``args.output_dir`` (main process only).

    ``run_info``: what identifies the run (credit, seed, model, ...); stored in ``run.json`` with the full
    config, plus a ``summary`` (TRL's final train metrics) when training ends. On resume, records past the
    checkpoint's step are dropped and ``wall_time`` continues from the last kept record.
    """

    def __init__(self, run_info: dict[str, Any] | None = None) -> None:
        self.run_info = dict(run_info or {})
        self._t0 = 0.0

    def _paths(self, args) -> tuple[Path, Path]:
        out = Path(args.output_dir)
        return out / "run.json", out / "metrics.jsonl"

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        run_json, metrics = self._paths(args)
        offset = 0.0
        if metrics.is_file():  # resumed (or restarted) run: keep what the checkpoint covers
            kept = [r for r in read_jsonl(metrics) if r.get("step", 0) <= state.global_step]
            offset = max((r.get("wall_time", 0.0) for r in kept), default=0.0)
            atomic_write(metrics, "".join(json.dumps(r) + "\n" for r in kept))
        self._t0 = time.time() - offset
        info = {"credit": getattr(args, "credit", "grpo"), "seed": args.seed, **self.run_info}
        info["config"] = args.to_dict()
        info["resumed_from_step"] = state.global_step
        write_json_atomic(run_json, info)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        run_json, metrics = self._paths(args)
        if "train_runtime" in logs:  # the end-of-training summary belongs to run.json, not the curve
            info = json.loads(run_json.read_text(encoding="utf-8")) if run_json.is_file() else {}
            info["summary"] = {k: _clean(v) for k, v in logs.items()}
            write_json_atomic(run_json, info)
            return
        record = {"step": state.global_step, "wall_time": round(self.elapsed(), 3)}
        record.update({k: _clean(v) for k, v in logs.items()})
        self.append(args, record)

    def elapsed(self) -> float:
        """A record's ``wall_time``: seconds since training start, continued across resumes."""
        return time.time() - self._t0

    def append(self, args, record: dict[str, Any]) -> None:
        """Append ``record`` as one line of ``metrics.jsonl`` (one write per line)."""
        with open(self._paths(args)[1], "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=float) + "\n")


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


def last_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The highest ``checkpoint-N`` in ``output_dir`` whose ``trainer_state.json`` is complete, else None.

    ``OARGRPOTrainer`` renames a checkpoint into place only once complete; for one written in place by another
    Trainer, which writes ``trainer_state.json`` last, a checkpoint interrupted mid-save is skipped too.
    """
    out = Path(output_dir)
    if not out.is_dir():
        return None
    steps = sorted(
        (int(m.group(1)), p) for p in out.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))
    )
    for _, path in reversed(steps):
        try:
            json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        return str(path)
    return None


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
    model, tokenizer = load_model_and_tokenizer(script_args.model, dtype=script_args.dtype,
                                                gguf_file=script_args.gguf_file)
    conversational = script_args.conversational == "true" or (
        script_args.conversational == "auto" and getattr(tokenizer, "chat_template", None) is not None
    )
    dataset = load_train_dataset(
        script_args.dataset, script_args.prompt_column, script_args.answer_column, script_args.prompt_template,
        conversational, script_args.dataset_split, script_args.dataset_config, script_args.max_train_samples,
    )
    run_info = {"model": script_args.model, "dataset": script_args.dataset, "train_rows": len(dataset)}
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


def save_final_model(trainer: Any, output_dir: str | os.PathLike) -> None:
    """``trainer.save_model(output_dir)``, crash-safe: every process saves into ``output_dir/.model-staging/``;
    once all files are written the main process renames each into ``output_dir`` (``os.replace``), so an
    interrupted save never leaves a truncated weight file. Pushes to the hub afterwards if ``args.push_to_hub``."""
    out = Path(output_dir)
    staging = out / FINAL_STAGING
    if trainer.is_world_process_zero():
        shutil.rmtree(staging, ignore_errors=True)  # what an interrupted save left
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(staging), _internal_call=True)  # every rank (gathers sharded weights)
    trainer.accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        for item in sorted(staging.iterdir()):
            target = out / item.name
            if item.is_dir() and target.is_dir():
                shutil.rmtree(target)
            os.replace(item, target)
        staging.rmdir()
    trainer.accelerator.wait_for_everyone()
    if trainer.args.push_to_hub:
        trainer.push_to_hub(commit_message="Final model")


def run_training(script_args: TrainArguments, config: OARConfig, reward_funcs=None) -> dict[str, Any]:
    """Train (or resume), save the final model into ``output_dir`` and return a summary of the run.

    Without ``resume`` an ``output_dir`` that already holds a run is refused (ValueError); with it, training
    continues from the last complete checkpoint (or starts fresh when there is none).
    """
    out = Path(config.output_dir)
    checkpoint = last_checkpoint(out) if script_args.resume else None
    if not script_args.resume and (out / "metrics.jsonl").is_file():
        raise ValueError(f"output_dir {str(out)!r} already holds a run; pass --resume to continue it "
                         "or choose another --output_dir")
    trainer = build_trainer(script_args, config, reward_funcs=reward_funcs)
    result = trainer.train(resume_from_checkpoint=checkpoint)
    save_final_model(trainer, config.output_dir)
    records = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").is_file() else []
    return summarize_run(records, result.metrics, config, checkpoint)


def summarize_run(records: list[dict[str, Any]], train_metrics: dict[str, Any], config: OARConfig,
              resumed_from: str | None = None) -> dict[str, Any]:
    """Final numbers of a run from its ``metrics.jsonl`` records and TRL's ``train()`` metrics."""

    def mean(key: str, last: int | None = None) -> float | None:
        vals = [r[key] for r in records if isinstance(r.get(key), int | float)]
        vals = vals[-last:] if last else vals
        return sum(vals) / len(vals) if vals else None

    return {
        "output_dir": config.output_dir,
        "credit": config.credit,
        "steps": max((r["step"] for r in records), default=0),
        "resumed_from": resumed_from,
        "train_runtime_s": train_metrics.get("train_runtime"),
        "reward_first": next((r["reward"] for r in records if isinstance(r.get("reward"), int | float)), None),
        "reward_last10": mean("reward", 10),
        "step_time_mean_s": mean("step_time"),
        "importance_share_mean": mean("oar/importance_share"),
        "frac_uniform_mean": mean("oar/frac_uniform"),
        "grad_clipped_frac": mean("oar/grad_clipped"),
    }
