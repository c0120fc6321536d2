"""``RunDirCallback``: writes the run-directory format (:mod:`oar.rundir`) from any ``transformers`` Trainer;
shared by ``oar train`` and the lab."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from oar.files import append_jsonl, atomic_write, read_jsonl
from oar.rundir import RunDir


def write_json_atomic(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON to ``path``, atomically."""
    atomic_write(path, json.dumps(data, indent=2, default=str))


def _drawn_from(record: dict[str, Any], step: int) -> bool:
    """Whether an attribution dump was drawn at global step ``step`` or later."""
    return isinstance(record.get("step"), int) and record["step"] >= step


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunDirCallback(TrainerCallback):
    """Writes ``run.json`` and ``metrics.jsonl`` into ``args.output_dir`` (main process only).

    ``run_info``: what identifies the run (credit, seed, model, ...); stored in ``run.json`` with the full
    config, plus a ``summary`` (TRL's final train metrics) when training ends. On resume, records past the
    checkpoint's step are dropped (``metrics.jsonl``: logged after step N; ``attributions.jsonl``: drawn at step
    N or later, which the resumed run draws again) and ``wall_time`` continues from the last kept record.
    """

    def __init__(self, run_info: dict[str, Any] | None = None) -> None:
        self.run_info = dict(run_info or {})
        self._t0 = 0.0

    def _paths(self, args) -> tuple[Path, Path]:
        run = RunDir(args.output_dir)
        return run.run_json, run.metrics_jsonl

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        run_json, metrics = self._paths(args)
        offset = 0.0
        if metrics.is_file():  # resumed (or restarted) run: keep what the checkpoint covers
            kept = [r for r in read_jsonl(metrics) if r.get("step", 0) <= state.global_step]
            offset = max((r.get("wall_time", 0.0) for r in kept), default=0.0)
            atomic_write(metrics, "".join(json.dumps(r) + "\n" for r in kept))
        dumps = run_json.parent / "attributions.jsonl"
        if dumps.is_file():  # a dump's step is the global step its rollout batch was drawn at: the run draws again
            kept = [r for r in read_jsonl(dumps) if not _drawn_from(r, state.global_step)]
            atomic_write(dumps, "".join(json.dumps(r) + "\n" for r in kept))
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
