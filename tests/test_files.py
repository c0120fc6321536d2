"""The shared atomic writer and JSONL reader."""

from __future__ import annotations

import json

import pytest

from oar.files import atomic_write, iter_jsonl, read_jsonl, replace_dir, strict_json


def test_atomic_write_leaves_no_temporary_file(tmp_path):
    path = atomic_write(tmp_path / "sub" / "a.json", '{"x": 1}')
    assert path.read_text() == '{"x": 1}'
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.json"]


def test_read_jsonl_skips_a_torn_last_line_and_names_a_bad_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n\n{"step": 2}\n{"step": 3, "lo')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        read_jsonl(path)


def test_iter_jsonl_names_the_line_and_skips_only_an_unfinished_tail(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:2: expected a JSON object, got list"):
        list(iter_jsonl(path))
    path.write_text('{"a": 1}\n{"a": 2, "b')  # cut before its newline: a writer still running
    assert list(iter_jsonl(path, skip_torn_tail=True)) == [(1, {"a": 1})]
    with pytest.raises(ValueError, match=r"rows.jsonl:2: not valid JSON"):
        list(iter_jsonl(path))
    path.write_text('{"a": 1}\n{"a": 2, "b\n')  # a complete line that is not JSON is not a torn tail
    with pytest.raises(ValueError, match=r"rows.jsonl:2: not valid JSON"):
        read_jsonl(path)


def test_replace_dir_keep_existing_keeps_a_finished_cache_entry(tmp_path):
    """A cache entry another process finished first is kept (never replaced under a reader); a fresh one moves in."""
    target, staged = tmp_path / "entry", tmp_path / ".entry.tmp"
    staged.mkdir()
    (staged / "config.json").write_text("new")
    replace_dir(staged, target, keep_existing=True)
    assert (target / "config.json").read_text() == "new" and not staged.exists()
    staged.mkdir()
    (staged / "config.json").write_text("second")
    replace_dir(staged, target, keep_existing=True)
    assert (target / "config.json").read_text() == "new" and not staged.exists()
    staged.mkdir()
    (staged / "config.json").write_text("second")
    replace_dir(staged, target)  # without keep_existing the new directory replaces the old
    assert (target / "config.json").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_strict_json_nulls_every_non_finite_float_at_any_depth():
    text = strict_json({"a": float("nan"), "b": [1.5, float("inf"), (float("-inf"), 2)], "c": {"d": "x", "e": None}})
    assert json.loads(text) == {"a": None, "b": [1.5, None, [None, 2]], "c": {"d": "x", "e": None}}
    assert "NaN" not in text and "Infinity" not in text
    assert strict_json([0.1], indent=None) == "[0.1]"
