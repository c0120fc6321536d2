"""The run-directory format every training run writes (``oar train``, the lab's runs), read by ``oar compare``
and ``oar report``::

    RUN_DIR/run.json           {"credit", "seed", "model", "dataset", ..., "config": {...}, "summary": {...}}
    RUN_DIR/metrics.jsonl      one JSON object per logging step: "step", "wall_time" (s since training start,
                               continued across resumes) and every logged key (TRL's and "oar/...")
    RUN_DIR/attributions.jsonl token-credit dumps (``oar_dump_every > 0``)
    RUN_DIR/checkpoint-N/      TRL checkpoints, renamed into place when complete (:mod:`oar.checkpoints`)

:class:`RunDirCallback` writes the first two from any ``transformers`` Trainer; :func:`run_dir_name` names the
run directories of a comparison.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from oar.files import append_jsonl, atomic_write, read_jsonl


def write_json_atomic(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON to ``path``, atomically."""
    atomic_write(path, json.dumps(data, indent=2, default=str))


# at most this many bytes (UTF-8) in a run directory's name: half of NAME_MAX (255 on ext4, xfs, btrfs, APFS,
# tmpfs), leaving room for the names derived from it (``.replaced-NAME`` by oar.files.replace_dir, ``.NAME.XXXXXXXX``
# temporary files of oar.files.atomic_write)
MAX_NAME_BYTES = 128
# characters a run directory's name never holds as they are: path separators, NUL and other control characters,
# and "~", which marks a shortened name (so a plain name never equals a shortened one)
_UNSAFE = re.compile(r"[/\\~\x00-\x1f\x7f]")


def run_dir_name(column: str, seed: int) -> str:
    """The directory name of one (credit column, seed) run of ``oar compare``: ``COLUMN-sSEED``
    (``oar-g@beta=2-s0``) when that has at most :data:`MAX_NAME_BYTES` bytes, does not start with a dot and holds
    no path separator, control character or ``~``; else ``PREFIX~HASH-sSEED``, PREFIX the column's start with
    such characters replaced by ``_`` and cut to fit, HASH the first 16 hex digits of the column's SHA-256.

    Deterministic; distinct (column, seed) pairs get distinct names (a plain name has no ``~``; two shortened
    names differ in their hash, 64 bits). The whole column is in the run's ``run.json``."""
    suffix = f"-s{seed}"
    plain = column + suffix
    size = len(plain.encode("utf-8", "surrogateescape"))  # an undecodable argv byte counts as one byte
    if size <= MAX_NAME_BYTES and not plain.startswith(".") and not _UNSAFE.search(plain):
        return plain
    digest = hashlib.sha256(column.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    room = MAX_NAME_BYTES - len(f"~{digest}{suffix}".encode())
    prefix = _UNSAFE.sub("_", column).lstrip(".")
    prefix = prefix.encode("utf-8", "replace")[:room].decode("utf-8", "ignore")  # no half character
    return f"{prefix}~{digest}{suffix}"


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
