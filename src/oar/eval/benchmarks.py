"""Math benchmarks: where each one lives (local JSONL files or the Hugging Face hub), how to read a row."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oar.files import iter_jsonl
from oar.grading import gold_answer


@dataclass(frozen=True)
class BenchmarkSpec:
    """``<data_dir>/<name>/test.jsonl`` locally, else ``load_dataset(hub_id, hub_config, split=...)``."""

    name: str
    hub_id: str
    hub_split: str
    hub_config: str | None = None


BENCHMARKS: dict[str, BenchmarkSpec] = {
    s.name: s
    for s in (
        BenchmarkSpec("gsm8k", "openai/gsm8k", "test", "main"),
        BenchmarkSpec("math500", "HuggingFaceH4/MATH-500", "test"),
        BenchmarkSpec("aime24", "HuggingFaceH4/aime_2024", "train"),
        BenchmarkSpec("amc23", "math-ai/amc23", "test"),
        BenchmarkSpec("minerva_math", "math-ai/minervamath", "test"),
        BenchmarkSpec("olympiadbench", "Hothan/OlympiadBench", "train", "OE_TO_maths_en_COMP"),
    )
}
QUESTION_FIELDS = ("problem", "question", "Problem", "Question")


@dataclass(frozen=True)
class Problem:
    """One benchmark item: its position in the file, the question text and the normalised gold answer."""

    benchmark: str
    index: int
    question: str
    gold: str


def parse_benchmarks(names: str | list[str]) -> list[str]:
    """``"gsm8k,math500"`` -> ``["gsm8k", "math500"]``; unknown names raise ValueError."""
    items = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    items = [n for n in items if n]
    unknown = [n for n in items if n not in BENCHMARKS]
    if unknown or not items:
        raise ValueError(f"unknown benchmark(s) {unknown or names!r}; choose from {', '.join(BENCHMARKS)}")
    return items


def to_problem(benchmark: str, index: int, row: dict[str, Any]) -> Problem:
    """A row of any supported layout -> :class:`Problem` (question field, gold via ``gold_answer``)."""
    question = next((row[f] for f in QUESTION_FIELDS if row.get(f)), None)
    if question is None:
        raise ValueError(f"row {index} of benchmark {benchmark!r} has no question field {QUESTION_FIELDS}")
    return Problem(benchmark, index, str(question), gold_answer(row, benchmark))


def load_benchmark(name: str, data_dir: str | Path | None = None, limit: int | None = None) -> list[Problem]:
    """The first ``limit`` problems of ``name``, from ``data_dir`` (``<name>/test.jsonl``) or the hub."""
    (name,) = parse_benchmarks([name])
    if data_dir is not None:
        path = Path(data_dir) / name / "test.jsonl"
        if not path.is_file():
            raise FileNotFoundError(
                f"benchmark file not found: {path} (expected <data-dir>/{name}/test.jsonl)"
            )
        rows = [row for _, row in iter_jsonl(path)]
    else:
        from datasets import load_dataset

        spec = BENCHMARKS[name]
        split = spec.hub_split if limit is None else f"{spec.hub_split}[:{limit}]"
        rows = list(load_dataset(spec.hub_id, spec.hub_config, split=split))
    return [to_problem(name, i, row) for i, row in enumerate(rows[:limit])]
