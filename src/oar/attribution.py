"""Token-credit records: what the trainer dumps and ``oar attribute`` renders (one JSON object a line)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass


@dataclass
class AttributionRecord:
    """One completion's token credit. All lists have one entry per completion token.

    ``scores``: raw importance (0 outside reasoning). ``weights``: Bi-Level weight (1 outside reasoning).
    ``reasoning`` / ``answer``: which tokens are reasoning and which the answer statement.
    """

    tokens: list[str]
    scores: list[float]
    weights: list[float]
    reasoning: list[bool]
    answer: list[bool]
    credit: str
    prompt: str = ""
    advantage: float | None = None
    reward: float | None = None
    step: int | None = None

    def __post_init__(self) -> None:
        n = len(self.tokens)
        for name in ("scores", "weights", "reasoning", "answer"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"AttributionRecord.{name} has {len(getattr(self, name))} entries, tokens has {n}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> AttributionRecord:
        missing = [k for k in ("tokens", "scores", "weights", "reasoning", "answer", "credit") if k not in data]
        if missing:
            raise ValueError(f"attribution record is missing fields {missing}")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def append_records(path: str | os.PathLike, records: Iterable[AttributionRecord]) -> None:
    """Append records to a JSONL file in one write (a reader never sees half a line)."""
    payload = "".join(json.dumps(r.to_json()) + "\n" for r in records)
    with open(path, "a", encoding="utf-8") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


def read_records(path: str | os.PathLike) -> list[AttributionRecord]:
    """Read every record of a JSONL file; a bad line raises ``ValueError`` naming its line number."""
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(AttributionRecord.from_json(json.loads(line)))
            except (json.JSONDecodeError, TypeError, ValueError) as err:
                raise ValueError(f"{path}:{i}: not an attribution record ({err})") from err
    return out
