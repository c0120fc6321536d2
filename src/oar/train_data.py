"""The training data of ``oar train``: a dataset read from a file, directory or hub id, every row checked
(non-empty problem text, a gold answer), then formatted into the ``prompt`` and ``answer`` columns TRL reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oar.prompts import ANSWER_COLUMN, PROMPT_TEMPLATE, QUESTION_COLUMN, fill_template


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

    ``source``: a local .jsonl/.json/.parquet file or dataset directory, ``easy-arithmetic`` (the bundled set,
    :mod:`oar.easy_arithmetic`), else a hub id. ValueError naming the
    file and line of malformed JSON, an empty dataset, a missing column, or the row and column of a bad value.
    """
    import datasets

    from oar.easy_arithmetic import EASY_ARITHMETIC, easy_arithmetic_rows

    path = Path(source).expanduser()
    looks_local = path.suffix in (".jsonl", ".json", ".parquet") or source.startswith(("/", ".", "~"))
    if source == EASY_ARITHMETIC and not path.exists():  # the bundled set (oar.easy_arithmetic)
        ds = datasets.Dataset.from_list(easy_arithmetic_rows())
    elif path.is_file():
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
