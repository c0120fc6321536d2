"""The terminal side of oar: the live run table, its ETA, the step line, and where library noise is silenced."""

from __future__ import annotations

import logging
import warnings

import pytest
from rich.console import Console

import oar.progress as progress
from oar.progress import ProgressLines, RunTable, format_duration
from oar.quiet import quiet_libraries


def test_format_duration():
    assert format_duration(75) == "1:15" and format_duration(3725) == "1:02:05" and format_duration(0) == "0:00"
    assert format_duration(None) == "–" and format_duration(float("nan")) == "–"


def test_eta_projects_running_runs_and_spreads_queued_ones_over_the_workers(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    view = RunTable(["a", "b", "c", "d"], workers=2, before=("warm",))
    assert view.eta_s() is None  # nothing measured yet
    view.update("warm", step=10, total=30, done=1 / 3)  # a stage: not a run, no ETA from it
    assert view.eta_s() is None
    view.update("a", status="running")
    view.update("b", status="running")
    clock[0] = 110.0
    view.update("a", step=5, done=0.5, s_per_step=2.0)  # 10 s for half: 20 s in all, 10 left
    view.update("b", step=1, done=0.01)  # below 5%: projected with the mean length (20 s), 10 left
    # 10 + 10 left on the running runs, 2 queued runs of 20 s each, over 2 workers
    assert view.eta_s() == pytest.approx((10 + 10 + 2 * 20) / 2)
    clock[0] = 120.0
    view.update("a", status="done", accuracy=0.4)
    assert view.rows["a"].done == 1.0 and view.rows["a"].ended == 120.0
    # a took 20 s; b (still unmeasured) is projected at that length and has run 20 s; c, d are queued
    assert view.eta_s() == pytest.approx((0 + 2 * 20) / 2)


def test_table_renders_one_line_per_run_and_the_overall_count():
    view = RunTable(["grpo-s0", "oar-g-s0"], workers=2, title="oar compare", before=("warm start",))
    view.update("warm start", status="cached", note="abc123")
    view.update("grpo-s0", step=12, done=0.5, accuracy=0.415, s_per_step=1.234)
    view.update("oar-g-s0", status="failed")
    console = Console(record=True, width=100, color_system=None)
    console.print(view)
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert lines[0] == "oar compare"
    assert [line.split()[0] for line in lines[2:5]] == ["warm", "grpo-s0", "oar-g-s0"]
    grpo = lines[3].split()
    assert grpo[1:4] == ["running", "12", "████░░░░"] and "41.5%" in grpo and "1.23" in grpo
    assert lines[4].split()[:2] == ["oar-g-s0", "failed"] and lines[2].split()[:3] == ["warm", "start", "cached"]
    assert "█" not in lines[2] and lines[2].endswith("abc123")  # a stage without steps has no bar
    assert lines[5].startswith("0/2 runs done · elapsed ")
    narrow = Console(record=True, width=72, color_system=None)  # the free-text note gives way, one line per row
    view.update("warm start", note="a very long note " * 5)
    narrow.print(view)
    rows = [line.rstrip() for line in narrow.export_text().splitlines()]
    assert len(rows) == 6 and max(map(len, rows)) <= 72
    assert rows[3].split()[:3] == ["grpo-s0", "running", "12"] and rows[2].endswith("…")


def test_progress_lines_count_per_name_and_close():
    lines = ProgressLines({"gsm8k": 3, "math500": 2})
    for _ in range(3):
        lines.advance("gsm8k", acc="50.0%")
    lines.advance("math500", 2, acc="0.0%")
    assert [(t.description.strip(), t.completed, t.fields["info"]) for t in lines._progress.tasks] == [
        ("gsm8k", 3, "acc 50.0%"), ("math500", 2, "acc 0.0%")]
    lines.close()
    lines.advance("gsm8k")  # closed: a no-op
    ProgressLines({"off": 3}, enabled=False).advance("off")


def test_quiet_libraries_silences_only_inside_and_restores():
    from transformers.utils import logging as tf_logging

    deprecation = "`gradient_checkpointing` is deprecated and will be removed in v6."
    level = tf_logging.get_verbosity()
    ds_logger = logging.getLogger("DeepSpeed")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_libraries():
            warnings.warn(deprecation, FutureWarning, stacklevel=1)
            warnings.warn("something else", FutureWarning, stacklevel=1)  # not on the list: still shown
            assert not tf_logging.is_progress_bar_enabled() and tf_logging.get_verbosity() == logging.ERROR
            assert ds_logger.filters and not ds_logger.filters[-1].filter(
                logging.LogRecord("DeepSpeed", logging.WARNING, "", 0, "Setting accelerator to CPU. If", None, None))
        warnings.warn(deprecation, FutureWarning, stacklevel=1)  # outside: shown again
        with quiet_libraries(verbose=True):
            warnings.warn(deprecation, FutureWarning, stacklevel=1)  # --verbose: everything stays
    assert [str(w.message) for w in seen] == ["something else", deprecation, deprecation]
    assert tf_logging.get_verbosity() == level and tf_logging.is_progress_bar_enabled() and not ds_logger.filters


def test_train_progress_line_follows_steps_and_logged_values():
    from types import SimpleNamespace

    from oar.train_run import TrainProgressCallback

    args, state = SimpleNamespace(disable_tqdm=False), SimpleNamespace(is_world_process_zero=True, max_steps=3,
                                                                       global_step=0)
    cb = TrainProgressCallback()
    cb.on_train_begin(args, state, None)
    cb.on_log(args, state, None, logs={"reward": 0.5, "step_time": 1.234, "oar/importance_share": 0.25, "loss": 1})
    for _ in range(3):
        cb.on_step_end(args, state, None)
    task = cb.lines._progress.tasks[0]
    assert task.completed == 3 and task.total == 3 and task.fields["info"] == "reward 0.500  s/step 1.23  scoring 25%"
    cb.on_train_end(args, state, None)
    assert cb.lines is None
    quiet = TrainProgressCallback()
    quiet.on_train_begin(SimpleNamespace(disable_tqdm=True), state, None)  # --disable_tqdm: no line
    assert quiet.lines is None
