"""Fault injection, fast cases: stale files, killed parents, non-finite rewards, resume exactness, bad input.

The kill-and-resume trials of ``oar train`` (SIGKILL during steps and saves, for every credit) are in
``benchmarks/faults.py``; their figures are in docs/robustness.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from oar.lab.compare import finished_run
from oar.lab.run import RunConfig

SRC = str(Path(__file__).resolve().parent.parent / "src")


# --- oar compare --------------------------------------------------------------------------------------------


def _lab_run(path: Path, cfg: RunConfig, last_step: int, last_wall: float, summary_final: dict | None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps({"credit": cfg.credit, "lab": asdict(cfg)}))
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


_POOL_PARENT = """
import sys, time
from oar.lab.compare import worker_pool
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
