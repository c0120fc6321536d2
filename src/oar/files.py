"""Atomic file writes (temporary file in the same directory, then ``os.replace``): the one writer of every
result file, so a crash never leaves a half-written one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write a file through a temporary file in the same directory and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The JSON objects of a JSONL file (one write per line, e.g. ``metrics.jsonl``).

    Blank lines are skipped and so is a half-written last line (a writer still running, or a crash); any
    other bad line raises ``ValueError`` naming it.
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if i == len(lines):
                break
            raise ValueError(f"{path}:{i}: not valid JSON ({err})") from err
        if isinstance(row, dict):
            rows.append(row)
    return rows
