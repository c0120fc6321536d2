"""Crash-safe files: atomic writes (temporary file in the same directory, then ``os.replace``), atomic directory
replacement, the one JSONL appender and reader, strict JSON text, and the writable-directory check run before
expensive work."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any


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


def strict_json(obj: Any, indent: int | None = 1) -> str:
    """``obj`` as strict JSON text (RFC 8259): every NaN or infinity, at any depth, becomes ``null``."""

    def finite(value: Any) -> Any:
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v) for v in value]
        return value

    return json.dumps(finite(obj), indent=indent, allow_nan=False)


def check_writable_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` if needed and prove a file can be written in it; ValueError naming it otherwise (a file
    in the way, no permission, a read-only file system), before any expensive work."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"output directory {str(path)!r} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(f"output directory {str(path)!r} is not writable ({err.strerror or err})") from err
    return path


def replace_dir(staged: str | os.PathLike, target: str | os.PathLike, keep_existing: bool = False) -> Path:
    """Move the finished directory ``staged`` to ``target`` (same file system) by renames only: an existing
    ``target`` is first renamed aside into ``staged``'s parent (a staging area the next save clears) and then
    deleted, so ``target`` is at every moment the old directory or the new one, never a mix.

    ``keep_existing`` (a cache entry another process may finish first): an existing non-empty ``target`` is
    kept and ``staged`` deleted; ``target`` is never replaced under a reader."""
    staged, target = Path(staged), Path(target)
    if keep_existing:
        try:
            os.replace(staged, target)  # fails on a non-empty target directory
        except OSError:
            if not (target.is_dir() and any(target.iterdir())):
                raise
            shutil.rmtree(staged, ignore_errors=True)
        return target
    aside = staged.parent / f".replaced-{target.name}"
    if target.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(target, aside)
    os.replace(staged, target)
    shutil.rmtree(aside, ignore_errors=True)
    return target


def append_jsonl(path: str | os.PathLike, records: Iterable[Mapping[str, Any]], *, fsync: bool = False,
                 **dumps: Any) -> None:
    """Append ``records`` to a JSONL file as one write (a crash tears at most the last line, which
    :func:`read_jsonl` skips); a line torn by an earlier crash is ended first. ``fsync``: to disk before
    returning. ``dumps``: ``json.dumps`` options."""
    text = "".join(json.dumps(r, **dumps) + "\n" for r in records)
    if not text:
        return
    with open(path, "a+b") as f:
        if f.tell() and (f.seek(f.tell() - 1), f.read(1))[1] != b"\n":
            text = "\n" + text
        f.write(text.encode("utf-8"))
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def iter_jsonl(path: str | os.PathLike, skip_torn_tail: bool = False) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each line of a JSONL file, streamed; blank lines are skipped.

    A line that is not JSON, or not a JSON object, raises ``ValueError`` naming it, except, with
    ``skip_torn_tail``, a last line cut short before its newline (a writer still running, or a crash).
    """
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                if skip_torn_tail and not line.endswith("\n"):
                    return
                raise ValueError(f"{path}:{i}: not valid JSON ({err})") from err
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{i}: expected a JSON object, got {type(row).__name__}")
            yield i, row


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The JSON objects of a JSONL file written one line per write (e.g. ``metrics.jsonl``), a torn last line
    skipped; any other bad line raises ``ValueError`` naming it (see :func:`iter_jsonl`)."""
    return [row for _, row in iter_jsonl(path, skip_torn_tail=True)]
