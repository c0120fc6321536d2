"""Everything ``oar train`` does, as importable functions: arguments, dataset, run directory, resume, training.

Run directory (read by ``oar compare`` and ``oar report``)::

    RUN_DIR/run.json           {"credit", "seed", "model", "dataset", ..., "config": {...}, "summary": {...}}
    RUN_DIR/metrics.jsonl      one JSON object per logging step: "step", "wall_time" (s since training start,
                               continued across resumes) and every logged key (TRL's and "oar/...")
    RUN_DIR/attributions.jsonl token-credit dumps (``oar_dump_every > 0``)
    RUN_DIR/checkpoint-N/      TRL checkpoints, renamed into place when complete; ``--resume`` continues from the last
"""

from __future__ import annotations

import enum
import json
import math
import os
import re
import shutil
import time
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from oar.files import append_jsonl, atomic_write, check_writable_dir, read_jsonl, replace_dir
from oar.prompts import ANSWER_COLUMN, PROMPT_TEMPLATE, QUESTION_COLUMN, check_template, fill_template
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
    resume: bool = field(default=False, metadata={"help": "Continue from the last checkpoint in output_dir."})


def parse_train_args(argv: list[str]) -> tuple[TrainArguments, OARConfig]:
    """``[--config FILE.yaml] [--field value ...]`` -> arguments, with TRL's own parser (CLI overrides YAML).

    On a machine without CUDA the defaults become ``use_cpu=True, bf16=False``.
    """
    import torch
    from trl import TrlParser

    if "--config" in argv[:-1]:
        check_config_file(argv[argv.index("--config") + 1], (TrainArguments, OARConfig))
    parser = TrlParser([TrainArguments, OARConfig], prog="oar train")
    if not torch.cuda.is_available():
        parser.set_defaults(use_cpu=True, bf16=False)
    script_args, config = parser.parse_args_and_config(args=argv)
    check_steps(config)
    if script_args.conversational not in ("auto", "true", "false"):
        raise ValueError(f"conversational must be 'auto', 'true' or 'false', got {script_args.conversational!r}")
    check_template(script_args.prompt_template)
    return script_args, config


def check_config_file(path: str, dataclasses: tuple[type, ...]) -> dict[str, Any]:
    """The ``--config`` YAML mapping, with a ValueError naming the file and line for bad YAML and naming the
    field for a value of the wrong type (``max_steps: 2.5``, a list for a float)."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"cannot read --config {path!r}: {err.strerror or err}") from err
    try:
        mapping = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise ValueError(f"{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from err
    if not isinstance(mapping, dict):
        raise ValueError(f"--config {path!r} must hold a YAML mapping of field: value, got {type(mapping).__name__}")
    hints: dict[str, Any] = {}
    for cls in dataclasses:
        hints.update(typing.get_type_hints(cls))
    for key, value in mapping.items():
        if key in hints and not _fits(value, hints[key]):
            raise ValueError(f"{path}: {key}: {value!r} is not a valid {_type_name(hints[key])}")
    return mapping


_SIMPLE = {int: (int,), float: (int, float), str: (str,), bool: (bool,), list: (list,), dict: (dict,)}


def _fits(value: Any, hint: Any) -> bool:
    """Whether a YAML value can be a field of type ``hint`` (unknown or complex types always fit)."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for member in members:
        if member is type(None):
            if value is None:
                return True
            continue
        base = typing.get_origin(member) or member
        if base not in _SIMPLE or isinstance(base, type) and issubclass(base, enum.Enum):
            return True  # Literal, enums, callables, ...: left to the dataclass
        if isinstance(value, _SIMPLE[base]) and not (isinstance(value, bool) and base is not bool):
            return True
        if isinstance(value, str) and base in (int, float, bool) and _parses(value, base):
            return True  # argparse converts string defaults: YAML reads 1e-3 as text
    return False


def _parses(text: str, base: type) -> bool:
    if base is bool:
        return text.lower() in ("true", "false", "yes", "no", "1", "0", "y", "n", "t", "f")
    try:
        base(text)
    except ValueError:
        return False
    return True


def _type_name(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")


def check_steps(config: OARConfig) -> None:
    """Step counts transformers would silently reinterpret: ``max_steps`` 0 or below -1 (it would train
    ``num_train_epochs`` instead), non-positive ``save_steps``/``logging_steps`` under the "steps" strategy."""
    if config.max_steps == 0 or config.max_steps < -1:
        raise ValueError(f"max_steps must be >= 1 (or -1: train num_train_epochs), got {config.max_steps}")
    for name, strategy in (("save_steps", "save_strategy"), ("logging_steps", "logging_strategy")):
        value = getattr(config, name)
        if str(getattr(getattr(config, strategy), "value", getattr(config, strategy))) == "steps" and not value > 0:
            raise ValueError(f"{name} must be > 0 with {strategy}='steps', got {value}")


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


def read_train_dataset(
    source: str,
    prompt_column: str = QUESTION_COLUMN,
    answer_column: str = ANSWER_COLUMN,
    split: str = "train",
    config_name: str | None = None,
    max_samples: int | None = None,
):
    """The raw ``datasets.Dataset``, every row checked: ``prompt_column`` non-empty text and ``answer_column``
    present (not None/NaN/empty) in each row.

    ``source``: a local .jsonl/.json/.parquet file or dataset directory, else a hub id. ValueError naming the
    file and line of malformed JSON, an empty dataset, a missing column, or the row and column of a bad value.
    """
    import datasets

    path = Path(source).expanduser()
    looks_local = path.suffix in (".jsonl", ".json", ".parquet") or source.startswith(("/", ".", "~"))
    if path.is_file():
        if path.suffix != ".parquet":
            _check_json_file(path)
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
    if len(ds) == 0:
        raise ValueError(f"dataset {source!r} has no rows")
    for role, col in (("prompt_column", prompt_column), ("answer_column", answer_column)):
        if col not in ds.column_names:
            raise ValueError(f"dataset {source!r} has no column {col!r} ({role}); columns: {ds.column_names}")
    if max_samples is not None:
        ds = ds.select(range(min(max_samples, len(ds))))
    _check_rows(source, ds[prompt_column], ds[answer_column], prompt_column, answer_column)
    return ds


def _check_json_file(path: Path) -> None:
    """ValueError naming ``FILE:LINE`` of malformed JSON Lines (a .json file may instead hold one JSON document),
    or an empty file."""
    from oar.files import iter_jsonl

    if path.suffix == ".json":
        try:
            json.loads(path.read_text(encoding="utf-8"))
            return
        except json.JSONDecodeError as err:
            first = next((line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()), "")
            try:
                json.loads(first)
            except json.JSONDecodeError:  # not JSON Lines either: the document's own error
                raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from err
    if sum(1 for _ in iter_jsonl(path)) == 0:  # reads every line: a bad one raises naming FILE:LINE
        raise ValueError(f"dataset file {str(path)!r} has no rows")


def _check_rows(source: str, prompts: list, answers: list, prompt_column: str, answer_column: str) -> None:
    from oar.grading import missing_gold

    for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True), 1):
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"dataset {source!r} row {i}: column {prompt_column!r} must be non-empty text, "
                             f"got {prompt!r}")
        if missing_gold(answer):
            raise ValueError(f"dataset {source!r} row {i}: column {answer_column!r} has no answer, got {answer!r}")


def format_train_dataset(ds, prompt_column: str = QUESTION_COLUMN, answer_column: str = ANSWER_COLUMN,
                         prompt_template: str = PROMPT_TEMPLATE, conversational: bool = False):
    """The columns ``prompt`` (text, or a one-turn chat) and ``answer`` (gold text) of a checked raw dataset."""

    def convert(row: dict[str, Any]) -> dict[str, Any]:
        text = fill_template(prompt_template, str(row[prompt_column]))
        prompt = [{"role": "user", "content": text}] if conversational else text
        return {"prompt": prompt, "answer": _gold(row[answer_column])}

    return ds.map(convert, remove_columns=ds.column_names)


def load_train_dataset(
    source: str,
    prompt_column: str = QUESTION_COLUMN,
    answer_column: str = ANSWER_COLUMN,
    prompt_template: str = PROMPT_TEMPLATE,
    conversational: bool = False,
    split: str = "train",
    config_name: str | None = None,
    max_samples: int | None = None,
):
    """:func:`read_train_dataset` then :func:`format_train_dataset`: a ``datasets.Dataset`` with the columns
    ``prompt`` and ``answer``."""
    ds = read_train_dataset(source, prompt_column, answer_column, split, config_name, max_samples)
    return format_train_dataset(ds, prompt_column, answer_column, prompt_template, conversational)


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
        append_jsonl(self._paths(args)[1], [record], default=float)


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
    check_template(script_args.prompt_template)
    raw = read_train_dataset(  # every row checked before the model loads
        script_args.dataset, script_args.prompt_column, script_args.answer_column, script_args.dataset_split,
        script_args.dataset_config, script_args.max_train_samples,
    )
    model, tokenizer = load_model_and_tokenizer(script_args.model, dtype=script_args.dtype,
                                                gguf_file=script_args.gguf_file)
    conversational = script_args.conversational == "true" or (
        script_args.conversational == "auto" and getattr(tokenizer, "chat_template", None) is not None
    )
    dataset = format_train_dataset(raw, script_args.prompt_column, script_args.answer_column,
                                   script_args.prompt_template, conversational)
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
            if item.is_dir():
                replace_dir(item, out / item.name)
            else:
                os.replace(item, out / item.name)
        staging.rmdir()
    trainer.accelerator.wait_for_everyone()
    if trainer.args.push_to_hub:
        trainer.push_to_hub(commit_message="Final model")


def run_training(script_args: TrainArguments, config: OARConfig, reward_funcs=None,
                 callbacks=None) -> dict[str, Any]:
    """Train (or resume), save the final model into ``output_dir`` and return a summary of the run.

    Without ``resume`` an ``output_dir`` that already holds a run is refused (ValueError); with it, training
    continues from the last complete checkpoint (or starts fresh when there is none), provided the settings
    that shape training are the stored ones (:func:`check_resume`). A checkpoint already at ``max_steps`` (a
    kill during the final save) is not trained further: its model is saved as the final one.
    """
    out = Path(config.output_dir)
    check_writable_dir(out)
    checkpoint = last_checkpoint(out) if script_args.resume else None
    if not script_args.resume and (out / "metrics.jsonl").is_file():
        raise ValueError(f"output_dir {str(out)!r} already holds a run; pass --resume to continue it "
                         "or choose another --output_dir")
    if script_args.resume:
        check_resume(out, script_args, config)
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
    records = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").is_file() else []
    return summarize_run(records, metrics, config, checkpoint)


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    """``global_step`` of a complete checkpoint (from its ``trainer_state.json``)."""
    return int(json.loads((Path(checkpoint) / "trainer_state.json").read_text(encoding="utf-8"))["global_step"])


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
    data options and every ``OARConfig`` field outside :data:`RESUMABLE_FIELDS`), before anything loads."""
    path = out / "run.json"
    if not path.is_file():
        return
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {path} to check the resumed settings: {err}") from err
    old = stored.get("config", {})
    new = json.loads(json.dumps(config.to_dict(), default=str))
    diffs = [f"{k}: {old[k]!r} -> {new[k]!r}" for k in sorted(old)
             if k in new and k not in RESUMABLE_FIELDS and old[k] != new[k]]
    now = _train_args(script_args)
    before = stored.get("train_args", {"model": stored.get("model"), "dataset": stored.get("dataset")})
    diffs += [f"{k}: {before[k]!r} -> {now[k]!r}" for k in sorted(before) if k in now and before[k] != now[k]]
    if diffs:
        raise ValueError(f"--resume with settings that differ from the run in {str(out)!r} ({'; '.join(diffs)}); "
                         "resume with the stored settings (run.json) or choose another --output_dir")


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
