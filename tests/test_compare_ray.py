"""``oar compare --backend ray`` on a local Ray cluster (2 CPUs): the same runs as the local pool, bit for bit
(every non-timing metric, with ``max_steps`` as the stop); ``--resume`` across backends; a task whose worker is
killed mid-run is retried and the study completes; a run that fails every attempt is named after the others
are written. Needs Ray (``oar-rl[ray]``): skipped, saying so, where it is not installed; CI installs it."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from oar.lab.compare import PRESETS, RunsFailed, base_config, compare, finished_run, run_config
from oar.lab.model import ModelConfig
from oar.lab.ray_pool import RayOptions
from oar.lab.task import TaskConfig
from oar.lab.warmstart import WarmStartConfig
from oar.rundir import RunDir

if importlib.util.find_spec("ray") is None:
    if os.environ.get("CI"):
        pytest.fail("CI must install the ray extra (oar-rl[ray]) for tests/test_compare_ray.py", pytrace=False)
    pytest.skip("Ray is not installed (pip install 'oar-rl[ray]'): oar compare --backend ray is not tested",
                allow_module_level=True)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# metrics that time something: they differ between any two runs; every other key must be equal, bit for bit
TIMINGS = {"wall_time", "eval_time", "step_time", "oar/importance_time", "oar/importance_share"}
COLUMNS = ("grpo", "oar-g")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One warm-start cache for the module (a warm start good enough to be right ~17 % of the time on one-step
    problems, so rewards differ within groups and the runs really update)."""
    return tmp_path_factory.mktemp("warm-cache")


def _base(**overrides):
    warm = WarmStartConfig(task=TaskConfig(min_steps=1, max_steps=1, verbosity=0, slip_rate=0.1),
                           model=ModelConfig(hidden=64, layers=2, mlp=256), steps=300, batch_size=32, lr=3e-3,
                           warmup=10)
    return base_config(PRESETS["quick"], overrides={
        "eval_problems": 16, "eval_k": 1, "eval_every": 3, "prompts_per_step": 4, "group_size": 4,
        "max_completion_length": 32, "budget_s": 1000.0, "max_steps": 3, "warm": warm, **overrides})


@pytest.fixture(autouse=True)
def no_memory_killer(monkeypatch):
    """Ray's memory monitor kills workers when the whole machine is short of memory; on a machine shared with
    other jobs that would be their doing, not the test's (a kill is still retried: see the killed-task test)."""
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "0")


@pytest.fixture
def ray_cluster():
    """A local Ray cluster with 2 CPUs, shut down after the test (its workers inherit this process's path)."""
    import ray

    from oar.lab.ray_pool import start_local_ray

    start_local_ray(num_cpus=2, log_to_driver=False, logging_level=logging.ERROR)
    yield ray
    ray.shutdown()


def _stamps(out: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/summary.json")}


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in rows]


def test_ray_runs_equal_the_local_pools_and_resume_across_backends(ray_cluster, cache, tmp_path):
    base = _base()
    local = compare(tmp_path / "local", base, COLUMNS, seeds=1, workers=2, cache_dir=cache, report=False,
                    progress=False)
    remote = compare(tmp_path / "ray", base, COLUMNS, seeds=1, cache_dir=cache, progress=False, ray=RayOptions())
    assert (local["backend"], remote["backend"], remote["errors"], remote["workers"]) == ("local", "ray", {}, 2)
    learned = False
    for name in ("grpo-s0", "oar-g-s0"):
        a, b = RunDir(tmp_path / "local" / name), RunDir(tmp_path / "ray" / name)
        rows = a.metrics()
        assert rows[-1]["step"] == 3 and _untimed(b.metrics()) == _untimed(rows)  # every metric of every step
        learned |= any(r.get("grad_norm", 0.0) > 0 for r in rows)
        ma, mb = a.meta(), b.meta()
        assert ma["lab"] == mb["lab"] and ma["credit_defaults"] == mb["credit_defaults"]
        assert {**ma["config"], "output_dir": None} == {**mb["config"], "output_dir": None}
        assert mb["config"]["output_dir"] == str((tmp_path / "ray" / name).resolve())
        sa, sb = a.summary(), b.summary()
        assert sa["steps"] == sb["steps"] == 3 and _untimed([sa["final"]]) == _untimed([sb["final"]])
    assert learned  # a comparison of runs that never updated would prove little
    for x, y in zip(local["runs"], remote["runs"], strict=True):
        assert (x["credit"], x["final_accuracy"], x["steps"], x["reward"], x["grad_norm"]) == \
            (y["credit"], y["final_accuracy"], y["steps"], y["reward"], y["grad_norm"])
    assert (tmp_path / "ray" / "results.md").is_file() and (tmp_path / "ray" / "report.md").is_file()

    # --resume across backends: Ray keeps the local pool's finished runs, the local pool keeps Ray's
    for out, ray in ((tmp_path / "local", RayOptions()), (tmp_path / "ray", None)):
        before = _stamps(out)
        again = compare(out, base, COLUMNS, seeds=1, workers=2, cache_dir=cache, report=False, progress=False,
                        resume=True, ray=ray)
        assert _stamps(out) == before and len(before) == 2
        assert [r["final_accuracy"] for r in again["runs"]] == [r["final_accuracy"] for r in local["runs"]]


def _kill_when_training(run_dir: Path, killed: list[int], deadline_s: float = 600.0) -> None:
    """Once ``run_dir`` has its first metrics (the run is training), SIGKILL the Ray worker running it (Ray names
    the process after the task: ``ray::oar:RUN``)."""
    import psutil

    title, end = f"ray::oar:{run_dir.name}", time.monotonic() + deadline_s
    while time.monotonic() < end and not killed:
        if RunDir(run_dir).is_run() and RunDir(run_dir).metrics():
            for p in psutil.process_iter(["pid", "cmdline"]):
                if " ".join(p.info["cmdline"] or []).strip() == title:
                    killed.append(p.info["pid"])
                    os.kill(p.info["pid"], signal.SIGKILL)
                    return
        time.sleep(0.02)


def test_a_task_killed_mid_run_is_retried_and_the_study_completes(ray_cluster, cache, tmp_path):
    base = _base(max_steps=12, eval_every=4)
    out, killed = tmp_path / "out", []
    killer = threading.Thread(target=_kill_when_training, args=(out / "grpo-s0", killed), daemon=True)
    killer.start()
    res = compare(out, base, ("grpo",), seeds=1, cache_dir=cache, report=False, progress=False,
                  ray=RayOptions(retries=2))
    killer.join(timeout=5)
    assert len(killed) == 1  # the worker was killed while the run trained
    assert len(res["errors"]["grpo-s0"]) == 1 and "Worker" in res["errors"]["grpo-s0"][0]
    rows = RunDir(out / "grpo-s0").metrics()
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 4, 8, 12]  # one whole run, not two halves
    assert finished_run(out / "grpo-s0", run_config(base, "grpo", 0))


BROKEN_CREDIT = '''
from oar.credit import register_credit


def broken(*args, **kwargs):
    raise RuntimeError("deliberately broken credit")


register_credit("broken", combine="multiply", needs_policy=False, needs_probe=False, passes="0", paper="test",
                summary="raises", effect=broken)(broken)
'''


def test_a_run_that_fails_every_attempt_is_named_after_the_others_are_written(cache, tmp_path, monkeypatch):
    """compare() starts its own local Ray instance here and ships the --import module to it (it is on this
    process's sys.path only, so the workers can import it only from the shipped copy)."""
    from oar.credit import unregister_credit

    name = f"broken_credit_{os.getpid()}"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / f"{name}.py").write_text(BROKEN_CREDIT)
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    out = tmp_path / "out"
    try:
        with pytest.raises(RunsFailed) as caught:
            compare(out, _base(max_steps=2), ("grpo", "broken"), seeds=1, workers=2, cache_dir=cache, report=False,
                    progress=False, imports=(name,), ray=RayOptions(retries=1))
    finally:
        unregister_credit("broken")
        sys.modules.pop(name, None)
    err = caught.value
    assert list(err.failed) == ["broken-s0"] and len(err.failed["broken-s0"]) == 2  # first attempt + 1 retry
    assert "broken-s0 (2 attempts, last: RuntimeError: deliberately broken credit)" in str(err)
    results = json.loads((out / "results.json").read_text())  # what finished is written
    assert list(results["credits"]) == ["grpo"] and results["errors"]["broken-s0"] == err.failed["broken-s0"]
    assert finished_run(out / "grpo-s0", run_config(_base(max_steps=2), "grpo", 0))
