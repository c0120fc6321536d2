"""The run-directory format every training run writes (``oar train``, the lab's runs), and its one reader::

    RUN_DIR/run.json           {"credit", "seed", "model", "dataset", ..., "config": {...}, "summary": {...}}
    RUN_DIR/metrics.jsonl      one JSON object per logging step: "step", "wall_time" (s since training start,
                               continued across resumes) and every logged key (TRL's and "oar/...")
    RUN_DIR/summary.json       a lab run's final numbers (``oar.lab.run.train_lab``)
    RUN_DIR/attributions.jsonl token-credit dumps (``oar_dump_every > 0``)
    RUN_DIR/checkpoint-N/      TRL checkpoints, renamed into place when complete (:mod:`oar.checkpoints`)

:class:`oar.rundir_callback.RunDirCallback` writes ``run.json`` and ``metrics.jsonl`` from any ``transformers``
Trainer; :class:`RunDir` reads a run directory (``oar compare``'s resume and results, ``oar report``'s plots);
:func:`run_dir_name` names the run directories of a comparison. Imports no torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from oar.files import read_jsonl

RUN_JSON, METRICS_JSONL, SUMMARY_JSON = "run.json", "metrics.jsonl", "summary.json"
# at most this many bytes (UTF-8) in a run directory's name: half of NAME_MAX (255 on ext4, xfs, btrfs, APFS,
# tmpfs), leaving room for the names derived from it (``.replaced-NAME`` by oar.files.replace_dir, ``.NAME.XXXXXXXX``
# temporary files of oar.files.atomic_write)
MAX_NAME_BYTES = 128
# characters a run directory's name never holds as they are: path separators, NUL and other control characters,
# and "~", which marks a shortened name (so a plain name never equals a shortened one)
_UNSAFE = re.compile(r"[/\\~\x00-\x1f\x7f]")


def run_dir_name(column: str, seed: int | str) -> str:
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


class RunDir:
    """One run directory: the paths of its files and their contents, read when asked (never cached)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.run_json = self.path / RUN_JSON
        self.metrics_jsonl = self.path / METRICS_JSONL
        self.summary_json = self.path / SUMMARY_JSON

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    def is_run(self) -> bool:
        """Whether the directory holds a run (its ``metrics.jsonl``)."""
        return self.metrics_jsonl.is_file()

    def meta(self) -> dict[str, Any]:
        """``run.json`` (``{}`` when there is none); ValueError when it is not a JSON object."""
        if not self.run_json.is_file():
            return {}
        meta = json.loads(self.run_json.read_text(encoding="utf-8"))
        if not isinstance(meta, dict):
            raise ValueError(f"{self.run_json}: expected a JSON object")
        return meta

    def metrics(self) -> list[dict[str, Any]]:
        """The ``metrics.jsonl`` records in file order (a torn last line, from a run still writing, skipped; any
        other bad line raises ValueError naming it); FileNotFoundError when the run has none."""
        if not self.metrics_jsonl.is_file():
            raise FileNotFoundError(f"{self.metrics_jsonl} not found")
        return read_jsonl(self.metrics_jsonl)

    def summary(self) -> dict[str, Any] | None:
        """``summary.json`` (a lab run's final numbers), None when there is none."""
        if not self.summary_json.is_file():
            return None
        return json.loads(self.summary_json.read_text(encoding="utf-8"))

    def files(self) -> dict[str, bytes]:
        """Every file under the directory by its relative path (``oar compare --backend ray`` sends a run's
        files back to the machine that writes the results)."""
        return {p.relative_to(self.path).as_posix(): p.read_bytes() for p in sorted(self.path.rglob("*"))
                if p.is_file()}
