"""Fault injection, fast cases: stale files, killed parents, non-finite rewards, resume exactness, bad input.

The kill-and-resume trials of ``oar train`` (SIGKILL during steps and saves, for every credit) are in
``checks/faults.py``; their figures are in docs/robustness.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from dataclasses import asdict
from pathlib import Path

import pytest

from oar.lab.compare import finished_run
from oar.lab.run import RunConfig, credit_defaults

SRC = str(Path(__file__).resolve().parent.parent / "src")


# --- oar compare --------------------------------------------------------------------------------------------


def _lab_run(path: Path, cfg: RunConfig, last_step: int, last_wall: float, summary_final: dict | None,
             defaults: dict | None = None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    info = {"credit": cfg.credit, "lab": asdict(cfg), "credit_defaults": credit_defaults(cfg) if defaults is None
            else defaults}
    (path / "run.json").write_text(json.dumps(info))
    rows = [{"step": 0, "wall_time": 0.0, "eval/accuracy": 0.1}]
    rows += [{"step": s, "wall_time": last_wall * s / last_step, "step_time": 1.0} for s in range(1, last_step)]
    rows.append({"step": last_step, "wall_time": last_wall, "step_time": 1.0, "eval/accuracy": 0.3})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary_final is not None:
        (path / "summary.json").write_text(json.dumps({"steps": summary_final["step"], "final": summary_final}))


def test_compare_resume_trusts_metrics_not_a_stale_summary(tmp_path):
    cfg = RunConfig(credit="grpo", budget_s=30.0, eval_every=10)
    done = {"step": 40, "wall_time": 30.5, "step_time": 1.0, "eval/accuracy": 0.3}
    _lab_run(tmp_path / "finished", cfg, 40, 30.5, done)
    assert finished_run(tmp_path / "finished", cfg)
    _lab_run(tmp_path / "at_max_steps", RunConfig(budget_s=30.0, max_steps=12), 12, 9.0,
             {"step": 12, "wall_time": 9.0, "step_time": 1.0, "eval/accuracy": 0.3})
    assert finished_run(tmp_path / "at_max_steps", RunConfig(budget_s=30.0, max_steps=12))

    # a finished run, rerun without --resume and killed 13 s in: fresh metrics, the old summary.json still there
    _lab_run(tmp_path / "restarted", cfg, 10, 13.0, done)
    assert not finished_run(tmp_path / "restarted", cfg)
    # stopped at an evaluation step, but neither the budget nor max_steps was reached: killed, not finished
    stale = {"step": 10, "wall_time": 13.0, "step_time": 1.0, "eval/accuracy": 0.3}
    _lab_run(tmp_path / "killed_at_eval", cfg, 10, 13.0, stale)
    assert not finished_run(tmp_path / "killed_at_eval", cfg)
    _lab_run(tmp_path / "no_summary", cfg, 40, 30.5, None)
    assert not finished_run(tmp_path / "no_summary", cfg)
    assert not finished_run(tmp_path / "finished", RunConfig(credit="grpo", budget_s=60.0, eval_every=10))
    # made when the credit's registered defaults were different (OAR-G's mode before session 6): run again
    old = RunConfig(credit="oar-g", budget_s=30.0, eval_every=10)
    _lab_run(tmp_path / "old_defaults", old, 40, 30.5, done, {**credit_defaults(old), "mode": "answer_mean"})
    assert not finished_run(tmp_path / "old_defaults", old)
    _lab_run(tmp_path / "same_defaults", old, 40, 30.5, done)
    assert finished_run(tmp_path / "same_defaults", old)


_POOL_PARENT = """
import sys, time
from oar.lab.pool import worker_pool
pool = worker_pool(1)
print(pool.submit(__import__("os").getpid).result(), flush=True)
pool.submit(time.sleep, 600)
time.sleep(600)
"""


def test_compare_pool_workers_die_with_their_parent():
    parent = subprocess.Popen([sys.executable, "-c", _POOL_PARENT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": SRC})
    try:
        worker = int(parent.stdout.readline())
        os.kill(worker, 0)  # alive while the parent is
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.kill(worker, 0)
            except ProcessLookupError:
                break
            # a zombie still answers kill(pid, 0); it is gone once its state is Z or it vanished
            stat = Path(f"/proc/{worker}/stat")
            if stat.is_file() and stat.read_text().split(") ")[1].startswith("Z"):
                break
            time.sleep(0.2)
        else:
            os.kill(worker, signal.SIGKILL)
            pytest.fail("the pool worker outlived its killed parent by 20 s")
    finally:
        if parent.poll() is None:
            parent.kill()


# --- oar eval -------------------------------------------------------------------------------------------------


def _eval_config(out, **kw):
    from helpers import TEST_DATA as SHARED_DATA
    from oar.eval.run import EvalConfig

    return EvalConfig(**{**dict(model="tiny", benchmarks="gsm8k", data_dir=SHARED_DATA, limit=6, samples=2,
                                temperature=1.0, max_new_tokens=6, batch_size=2, output_dir=str(out)), **kw})


def test_sampled_eval_resume_draws_the_same_samples(monkeypatch, tmp_path, char_tokenizer):
    """A sampled eval killed after its first batch and resumed writes the uninterrupted run's completions."""
    from helpers import make_tiny_lm
    from oar.eval import run as eval_run
    from oar.eval.generation import HFGenerator
    from oar.eval.run import evaluate, read_samples

    model = make_tiny_lm(len(char_tokenizer))
    calls = {"n": 0, "kill_at": None}

    def generate(prompts, **kw):
        calls["n"] += 1
        if calls["n"] == calls["kill_at"]:
            raise KeyboardInterrupt("killed")
        return HFGenerator(model, char_tokenizer)(prompts, **kw)

    monkeypatch.setattr(eval_run, "_make_generator", lambda cfg: (generate, char_tokenizer))
    evaluate(_eval_config(tmp_path / "full"), progress=False)
    calls.update(n=0, kill_at=2)
    with pytest.raises(KeyboardInterrupt):
        evaluate(_eval_config(tmp_path / "killed"), progress=False)
    calls.update(n=0, kill_at=None)
    evaluate(_eval_config(tmp_path / "killed"), progress=False)
    full = read_samples(tmp_path / "full" / "samples.jsonl", 2)
    resumed = read_samples(tmp_path / "killed" / "samples.jsonl", 2)
    assert set(full) == set(resumed) and len(full) == 6
    differ = [k for k in full if [r["completion"] for r in full[k]] != [r["completion"] for r in resumed[k]]]
    assert not differ, f"{len(differ)} of 6 problems have other samples after the resume"


def test_a_failed_eval_does_not_block_the_corrected_rerun(monkeypatch, tmp_path):
    from oar.eval import run as eval_run
    from oar.eval.run import evaluate

    def broken(cfg):
        raise ValueError(f"could not load model {cfg.model!r}")

    monkeypatch.setattr(eval_run, "_make_generator", broken)
    with pytest.raises(ValueError, match="could not load"):
        evaluate(_eval_config(tmp_path, model="typo", samples=1, temperature=None), progress=False)
    assert not (tmp_path / "config.json").exists()

    def fake(prompts, *, samples, **kw):
        return [["\\boxed{1}"] * samples for _ in prompts]

    monkeypatch.setattr(eval_run, "_make_generator", lambda cfg: (fake, types.SimpleNamespace(chat_template=None)))
    summary = evaluate(_eval_config(tmp_path, model="right", samples=1, temperature=None), progress=False)
    assert summary["benchmarks"]["gsm8k"]["problems"] == 6
    assert json.loads((tmp_path / "config.json").read_text())["model"] == "right"


@pytest.mark.parametrize("blocked", ["file", "under a file"])
def test_eval_output_dir_blocked_by_a_file_is_one_line(tmp_path, capsys, blocked):
    from helpers import TEST_DATA as SHARED_DATA
    from oar.cli import main

    (tmp_path / "f").write_text("x")
    out = tmp_path / "f" if blocked == "file" else tmp_path / "f" / "out"
    assert main(["eval", "--model", "smollm2", "--data-dir", SHARED_DATA, "--limit", "1",
                 "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("oar eval: error:") and str(out) in err[-1]


def test_append_jsonl_ends_a_torn_line_first(tmp_path):
    from oar.files import append_jsonl, read_jsonl

    path = tmp_path / "m.jsonl"
    append_jsonl(path, [{"step": 1}])
    with open(path, "a") as f:
        f.write('{"step": 2, "lo')  # a crash mid-line
    append_jsonl(path, [{"step": 2}, {"step": 3}])
    assert path.read_text().splitlines()[1] == '{"step": 2, "lo'
    with pytest.raises(ValueError, match=":2:"):
        read_jsonl(path)  # the torn line is named, not silently merged into the next record
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()[2:]] == [2, 3]


def test_replace_dir_is_old_or_new_never_a_mix(tmp_path, monkeypatch):
    from oar import files

    target, staging = tmp_path / "checkpoint-2", tmp_path / ".staging"
    target.mkdir()
    (target / "a").write_text("old")
    (staging / "checkpoint-2").mkdir(parents=True)
    (staging / "checkpoint-2" / "a").write_text("new")
    real = os.replace
    calls = []

    def dying_replace(src, dst):  # a kill between moving the old one aside and renaming the new one in
        calls.append((src, dst))
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(files.os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        files.replace_dir(staging / "checkpoint-2", target)
    assert not target.exists()  # no checkpoint-2 at all (resume takes the previous one), never a mixed one
    assert (staging / ".replaced-checkpoint-2" / "a").read_text() == "old"
    monkeypatch.setattr(files.os, "replace", real)
    (target).mkdir()
    (target / "a").write_text("old")
    files.replace_dir(staging / "checkpoint-2", target)
    assert (target / "a").read_text() == "new" and sorted(p.name for p in staging.iterdir()) == []


def test_eval_of_an_empty_benchmark_file_is_one_line(tmp_path, capsys):
    from oar.cli import main

    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    (tmp_path / "data" / "gsm8k" / "test.jsonl").write_text("")
    assert main(["eval", "--model", "smollm2", "--benchmarks", "gsm8k", "--data-dir", str(tmp_path / "data"),
                 "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("oar eval: error:") and "'gsm8k'" in err[-1] and "no problems" in err[-1]


# --- oar compare: the output directory, run directory names, results, --import (issue 31) ---------------------


def test_run_dir_names_are_bounded_deterministic_and_distinct():
    from oar.rundir import MAX_NAME_BYTES, run_dir_name

    assert run_dir_name("grpo", 0) == "grpo-s0"
    assert run_dir_name("oar-g@beta=2&tau=0.5", 11) == "oar-g@beta=2&tau=0.5-s11"
    long = "oar-prefix@separator=" + "x" * 300
    cases = [long, long + "y", long[:-1] + "y", "é" * 200, "a/b", "a\\b", "a\nb", ".hidden", "a~" + "0" * 16,
             "x" * (MAX_NAME_BYTES - 3), "x" * (MAX_NAME_BYTES - 2), "中" * 60 + "@x=1"]
    names = {(c, s): run_dir_name(c, s) for c in cases for s in (0, 7, 123)}
    assert len(set(names.values())) == len(names)  # collision-free
    for (c, s), name in names.items():
        assert len(name.encode("utf-8")) <= MAX_NAME_BYTES and name.endswith(f"-s{s}"), name
        assert "/" not in name and "\\" not in name and "\n" not in name and not name.startswith(".")
        assert name == run_dir_name(c, s)  # deterministic
    assert names[(long, 0)].startswith("oar-prefix@separator=xxx") and "~" in names[(long, 0)]
    assert "~" not in names[("x" * (MAX_NAME_BYTES - 3), 0)] and "~" in names[("x" * (MAX_NAME_BYTES - 2), 0)]
    assert "~" in names[("a~" + "0" * 16, 0)]  # a plain name never holds the shortened form's mark


@pytest.fixture
def fake_lab(monkeypatch):
    """``oar compare`` without training: a cached warm start, and each run writes a small finished curve."""
    from oar.lab import compare as lab_compare

    def warm_start(cfg, cache_dir=None, report=None, progress=True):
        return None, None, Path("fake-warm-start")

    def train_lab(cfg, run_dir, cache_dir=None, report=None):
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)  # the long column's OSError came from here
        evals = {"eval/greedy_accuracy": 0.3, "eval/pass_at_k": 0.5}
        rows = [{"step": 0, "wall_time": 0.0, "eval/accuracy": 0.2, **evals},
                {"step": 5, "wall_time": cfg.budget_s, "step_time": 1.0, "eval/accuracy": 0.4, **evals}]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run_dir / "run.json").write_text(json.dumps({"credit": cfg.credit, "lab": asdict(cfg)}))
        return {"final": rows[-1]}

    from oar.lab import pool

    monkeypatch.setattr(lab_compare, "warm_start", warm_start)
    monkeypatch.setattr(pool, "train_lab", train_lab)


def test_compare_with_a_long_credit_column_keeps_run_dir_names_in_bounds(tmp_path, fake_lab):
    from oar.lab.compare import base_config, compare, get_preset
    from oar.rundir import MAX_NAME_BYTES

    long = "oar-prefix@separator=" + "x" * 300
    res = compare(tmp_path / "out", base_config(get_preset("quick")), (long, long + "z"), seeds=2, workers=1,
                  report=False, progress=False)
    dirs = sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir())
    assert len(dirs) == 4 and all(len(d.encode()) <= MAX_NAME_BYTES for d in dirs), dirs
    assert set(res["credits"]) == {long, long + "z"}  # the full columns in the results
    runs = [json.loads((tmp_path / "out" / d / "run.json").read_text()) for d in dirs]
    assert sorted(r["lab"]["credit"] for r in runs) == sorted([long, long + "z"] * 2)  # each column whole


def _compare_error(capsys, out, *extra) -> str:
    from oar.cli import main

    assert main(["compare", "--quick", "--credits", "grpo", "--workers", "1", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("oar compare: error:") and sum("error:" in x for x in err) == 1, err
    return err[-1]


@pytest.mark.parametrize("blocked", ["out is a file", "out under a file", "out not writable", "run dir is a file",
                                     "results.json is a directory", "figures is a file"])
def test_compare_output_dir_problems_are_one_line_before_the_warm_start(tmp_path, capsys, monkeypatch, blocked):
    import tempfile

    from oar.lab import compare as lab_compare

    def reached(*args, **kwargs):
        raise AssertionError("the warm start was reached")

    monkeypatch.setattr(lab_compare, "warm_start", reached)
    out, named = tmp_path / "out", None
    if blocked == "out is a file":
        out.write_text("x")
    elif blocked == "out under a file":
        (tmp_path / "f").write_text("x")
        out = tmp_path / "f" / "out"
    elif blocked == "out not writable":  # simulated: the suite may run as root, which ignores modes
        def denied(*args, **kwargs):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(tempfile, "mkstemp", denied)
    else:
        out.mkdir()
        named = out / {"run dir is a file": "grpo-s0", "results.json is a directory": "results.json",
                       "figures is a file": "figures"}[blocked]
        named.mkdir() if blocked == "results.json is a directory" else named.write_text("x")
    err = _compare_error(capsys, out)
    assert str(named or out) in err, err


def test_results_that_cannot_be_written_are_one_line_and_keep_the_runs(tmp_path, capsys, monkeypatch, fake_lab):
    from oar.lab import compare as lab_compare

    def full_disk(path, data):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(lab_compare, "atomic_write", full_disk)
    err = _compare_error(capsys, tmp_path / "out")
    assert "cannot write the results" in err and "No space left on device" in err and "--resume" in err, err
    assert (tmp_path / "out" / "grpo-s0" / "metrics.jsonl").is_file()


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    pkg = tmp_path / "usermods"
    pkg.mkdir()
    (pkg / "raises_value.py").write_text("x = 1\nraise ValueError('bad setting in the user module')\n")
    (pkg / "raises_runtime.py").write_text("def f():\n    raise RuntimeError('boom')\nf()\n")
    (pkg / "missing_dep.py").write_text("import not_an_installed_package_xyz\n")
    (pkg / "syntax.py").write_text("def (:\n")
    monkeypatch.syspath_prepend(str(pkg))
    return pkg


@pytest.mark.parametrize("command", [["credits"], ["compare", "--quick"], ["attribute", "--prompt", "p",
                                                                             "--completion", "c"],
                                     ["train", "--model", "m"]])
@pytest.mark.parametrize("module", [".relative", "..up", "pkg/mod.py", "a..b", "", "no_such_module_xyz",
                                    "os.no_such_sub"])
def test_import_of_a_bad_module_name_is_one_line(capsys, command, module):
    from oar.cli import main

    assert main([command[0], "--import", module, *command[1:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"oar {command[0]}: error: --import") and repr(module) in err[0], err


@pytest.mark.parametrize("module, raised", [("raises_value", "ValueError"), ("raises_runtime", "RuntimeError"),
                                            ("missing_dep", "ModuleNotFoundError"), ("syntax", "SyntaxError")])
@pytest.mark.parametrize("command", ["credits", "compare", "train"])
def test_a_user_module_that_raises_says_which_import_then_its_traceback(capsys, user_modules, module, raised,
                                                                       command):
    from oar.cli import main

    with pytest.raises(SystemExit) as stop:
        main([command, "--import", module, *(["--model", "m"] if command == "train" else [])])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    first, rest = err.split("\n", 1)
    assert first == (f"oar {command}: error: --import {module!r} failed: importing it raised {raised} "
                     "(its traceback follows)")
    assert rest.startswith("Traceback") and f"{module}.py" in rest and rest.strip().splitlines()[-1].startswith(raised)
