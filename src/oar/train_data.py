"""The training data of ``oar train``: a dataset read from a file, directory or hub id, every row checked
(non-empty problem text, a gold answer), then formatted into the ``prompt`` and ``answer`` columns TRL reads.

A JSON / JSON Lines file is parsed here first, so its answers stay the text the file holds (pyarrow's type
inference would read a 400-digit integer as ``inf`` and round integers above 2**63) and its defects are named by
file, line and column (a duplicated key, NaN / Infinity, a row that is not an object).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oar.prompts import ANSWER_COLUMN, PROMPT_TEMPLATE, QUESTION_COLUMN, SOLUTION_COLUMN, fill_template


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

    if max_samples is not None and (isinstance(max_samples, bool) or not isinstance(max_samples, int)
                                    or max_samples < 1):
        raise ValueError(f"max_train_samples must be an integer >= 1 (or unset: every row), got {max_samples!r}")
    from oar.easy_arithmetic import EASY_ARITHMETIC, easy_arithmetic_rows

    path = Path(source).expanduser()
    looks_local = path.suffix in (".jsonl", ".json", ".parquet") or source.startswith(("/", ".", "~"))
    lines: list[int] | None = None  # the line of each row of a JSON Lines file
    if source == EASY_ARITHMETIC and not path.exists():  # the bundled set (oar.easy_arithmetic)
        ds = _json_dataset(easy_arithmetic_rows())
    elif path.is_file() and path.suffix != ".parquet":
        rows, lines = read_json_rows(path, answer_column)
        ds = _json_dataset(rows)
    elif path.is_file():
        ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
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
    _check_rows(source, ds[prompt_column], ds[answer_column], prompt_column, answer_column, lines)
    return ds


class _NonFinite(str):
    """``NaN`` / ``Infinity`` / ``-Infinity`` in a JSON file (not JSON, though Python's parser reads it)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) < len(keys):
        dup = next(k for i, k in enumerate(keys) if k in keys[:i])
        raise ValueError(f"duplicated key {dup!r} (the object names it twice)")
    return dict(pairs)


def _holds(value: Any, kind: type) -> bool:
    if isinstance(value, kind):
        return True
    if isinstance(value, dict):
        return any(_holds(v, kind) for v in value.values())
    return isinstance(value, list) and any(_holds(v, kind) for v in value)


def _as_text(value: Any) -> Any:
    """An answer as text: a number keeps the literal digits of the file (parsed with ``parse_int=str``), a list of
    pieces becomes one text as ``normalize_gold`` joins them; other values are left for the row check."""
    from oar.grading import normalize_gold

    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return normalize_gold(value)
    return value


def read_json_rows(path: Path, answer_column: str) -> tuple[list[dict[str, Any]], list[int] | None]:
    """The rows of a JSON Lines file (or a .json file holding one array of objects, or one object), the answer
    column as the file's text, and the line of each row (None for a .json document).

    ValueError naming ``FILE:LINE`` (or the row) and the column for: malformed JSON, a row that is not an
    object, a duplicated key, ``NaN`` / ``Infinity`` or a number beyond a float's range outside the answer column
    (``datasets`` cannot read them); also for a file without rows.
    """
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err
    hooks = dict(object_pairs_hook=_unique_keys, parse_constant=_NonFinite)
    documents: list[tuple[str, str | None, Any]] = []  # (where, its own text to re-read literally, value)
    literal: list[Any] = []  # a whole document with its numbers as text, read once if an answer needs it
    whole = None
    if path.suffix == ".json":
        try:
            whole = json.loads(text, **hooks)
        except json.JSONDecodeError as err:
            first = next((line for line in text.splitlines() if line.strip()), "")
            try:
                json.loads(first)
            except json.JSONDecodeError:  # not JSON Lines either: the document's own error
                raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from err
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err
    if whole is not None:
        items = whole if isinstance(whole, list) else [whole]
        documents = [(f"row {i}", None, item) for i, item in enumerate(items, 1)]
    else:
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                documents.append((f"line {i}", line, json.loads(line, **hooks)))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{i}: not valid JSON ({err})") from err
            except ValueError as err:
                raise ValueError(f"{path}:{i}: {err}") from err
    if not documents:
        raise ValueError(f"dataset file {str(path)!r} has no rows")
    rows: list[dict[str, Any]] = []
    for at, own, row in documents:
        if not isinstance(row, dict):
            raise ValueError(f"{path}: {at}: expected a JSON object, got {type(row).__name__}")
        for key, value in row.items():
            if _holds(value, _NonFinite):
                raise ValueError(f"{path}: {at}: column {key!r} holds a non-finite number (NaN or Infinity)")
            if key != answer_column and _nonfinite_float(value):
                raise ValueError(f"{path}: {at}: column {key!r} holds a number beyond a float's range")
        if answer_column in row and _holds(row[answer_column], (int, float)):  # the file's digits, as text
            if own is not None:
                row[answer_column] = json.loads(own, parse_int=str, parse_float=str)[answer_column]
            else:
                if not literal:
                    doc = json.loads(text, parse_int=str, parse_float=str)
                    literal = doc if isinstance(doc, list) else [doc]
                row[answer_column] = literal[len(rows)][answer_column]
        if answer_column in row:
            row[answer_column] = _as_text(row[answer_column])
        rows.append(row)
    return rows, None if whole is not None else [int(at.split()[1]) for at, _, _ in documents]


def _nonfinite_float(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_nonfinite_float(v) for v in value.values())
    return isinstance(value, list) and any(_nonfinite_float(v) for v in value)


def _json_dataset(rows: list[dict[str, Any]]):
    """``datasets``' own JSON reader over the checked rows (staged as JSON Lines in a temporary directory, read into
    memory): other columns are read as it always reads them, the answer column as the text it now holds."""
    import datasets

    with tempfile.TemporaryDirectory(prefix="oar-rows-") as tmp:
        staged = Path(tmp) / "rows.jsonl"
        staged.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        return datasets.load_dataset("json", data_files=str(staged), split="train", cache_dir=tmp,
                                     keep_in_memory=True)


def _require_text(value: Any, where: str, column: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: column {column!r} must be non-empty text, got {value!r}")


def _check_rows(source: str, prompts: list, answers: list, prompt_column: str, answer_column: str,
                lines: list[int] | None = None) -> None:
    from oar.grading import missing_gold

    for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True), 1):
        at = f"row {i}" + (f" (line {lines[i - 1]})" if lines and lines[i - 1] != i else "")
        _require_text(prompt, f"dataset {source!r} {at}", prompt_column)
        if isinstance(answer, float) and math.isinf(answer):
            raise ValueError(f"dataset {source!r} {at}: column {answer_column!r} holds {answer!r}, not a finite "
                             "answer")
        if missing_gold(answer):
            raise ValueError(f"dataset {source!r} {at}: column {answer_column!r} has no answer, got {answer!r}")


def split_worked_examples(ds, n: int, prompt_column: str = QUESTION_COLUMN,
                          solution_column: str = SOLUTION_COLUMN) -> tuple[list[tuple[str, str]], Any]:
    """The first ``n`` rows of a checked raw dataset as ``(question, solution)`` pairs, and the other rows (the
    examples are not trained on). ValueError, before any model loads, when ``n`` is not in ``0..rows-1``, the
    column is missing, or an example's solution is not non-empty text."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < len(ds):
        raise ValueError(f"worked_examples must be an integer in 0..{len(ds) - 1} (fewer than the dataset's "
                         f"{len(ds)} rows), got {n!r}")
    if n == 0:
        return [], ds
    if solution_column not in ds.column_names:
        raise ValueError(f"worked_examples needs a solution column {solution_column!r} (solution_column); "
                         f"columns: {ds.column_names}")
    head = ds.select(range(n))
    examples = list(zip(head[prompt_column], head[solution_column], strict=True))
    for i, (_, solution) in enumerate(examples, 1):
        _require_text(solution, f"worked example {i}", solution_column)
    return examples, ds.select(range(n, len(ds)))


def format_train_dataset(ds, prompt_column: str = QUESTION_COLUMN, answer_column: str = ANSWER_COLUMN,
                         prompt_template: str = PROMPT_TEMPLATE, conversational: bool = False,
                         examples: Sequence[tuple[str, str]] = ()):
    """The columns ``prompt`` (text, or a chat) and ``answer`` (gold text, whatever the raw column's type) of a
    checked raw dataset. ``examples``: ``(question, solution)`` pairs shown before every problem, each question
    through the template: as user/assistant turns in a chat, else as text blocks separated by blank lines."""
    turns = [(fill_template(prompt_template, str(q)), a) for q, a in examples]
    head = [{"role": role, "content": text} for q, a in turns for role, text in (("user", q), ("assistant", a))]
    prefix = "".join(f"{q}\n{a}\n\n" for q, a in turns)

    def convert(row: dict[str, Any]) -> dict[str, Any]:
        text = fill_template(prompt_template, str(row[prompt_column]))
        prompt = [*head, {"role": "user", "content": text}] if conversational else prefix + text
        return {"prompt": prompt, _GOLD: _gold(row[answer_column])}

    # a new column name: ``map`` would cast a column named like a raw one back to the raw type (int64, float64)
    return ds.map(convert, remove_columns=ds.column_names).rename_column(_GOLD, "answer")


_GOLD = "__oar_gold__"


def load_train_dataset(
    source: str,
    prompt_column: str = QUESTION_COLUMN,
    answer_column: str = ANSWER_COLUMN,
    prompt_template: str = PROMPT_TEMPLATE,
    conversational: bool = False,
    split: str = "train",
    config_name: str | None = None,
    max_samples: int | None = None,
    worked_examples: int = 0,
    solution_column: str = SOLUTION_COLUMN,
):
    """:func:`read_train_dataset`, :func:`split_worked_examples` (the first ``worked_examples`` rows shown before
    every problem, not trained on), then :func:`format_train_dataset`: a ``datasets.Dataset`` with the columns
    ``prompt`` and ``answer``."""
    ds = read_train_dataset(source, prompt_column, answer_column, split, config_name, max_samples)
    examples, ds = split_worked_examples(ds, worked_examples, prompt_column, solution_column)
    return format_train_dataset(ds, prompt_column, answer_column, prompt_template, conversational, examples)
