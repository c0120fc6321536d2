"""``oar compare``: statistics, the results table, argument errors, and one tiny end-to-end comparison."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from oar.cli import main
from oar.credit import CreditSpec
from oar.lab.compare import PRESETS, base_config, compare, credit_columns, get_preset
from oar.lab.model import ModelConfig
from oar.lab.run import LabCallback, RunConfig, credit_defaults
from oar.lab.stats import mean_ci, t_quantile
from oar.lab.summary import format_results_table, summarize_comparison
from oar.lab.task import TaskConfig
from oar.lab.warmstart import WarmStartConfig


def test_mean_ci_matches_hand_computation():
    s = mean_ci([0.5, 0.6, 0.7])
    assert s["mean"] == pytest.approx(0.6) and s["std"] == pytest.approx(0.1)
    assert s["ci95"] == pytest.approx(4.303 * 0.1 / math.sqrt(3))
    assert math.isnan(mean_ci([0.4])["ci95"]) and t_quantile(11) == 2.179 and t_quantile(100) == 1.96


def _fake_run(path, accs, step_time, entropy):
    path.mkdir(parents=True)
    rows = []
    for i, a in enumerate(accs):
        rows.append({"step": 10 * i, "wall_time": 5.0 * i, "eval/accuracy": a, "eval/greedy_accuracy": a + 0.1,
                     "eval/pass_at_k": a + 0.2, **({"step_time": step_time, "entropy": entropy, "grad_norm": 1.0,
                                                    "reward": a} if i else {})})
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_summarize_aggregates_over_seeds_and_times_to_reference(tmp_path):
    dirs = {("grpo", 0): _fake_run(tmp_path / "g0", [0.2, 0.3, 0.4, 0.4], 1.0, 0.5),
            ("grpo", 1): _fake_run(tmp_path / "g1", [0.2, 0.3, 0.3, 0.5], 1.0, 0.4),
            ("oar-g", 0): _fake_run(tmp_path / "o0", [0.2, 0.45, 0.5, 0.5], 1.5, 0.6),
            ("oar-g", 1): _fake_run(tmp_path / "o1", [0.2, 0.2, 0.3, 0.3], 1.5, 0.6)}
    res = summarize_comparison(dirs)
    g, o = res["credits"]["grpo"], res["credits"]["oar-g"]
    assert res["reference_final_accuracy"] == pytest.approx(0.4)  # mean of last-two averages 0.4 and 0.4
    assert g["final_accuracy"]["mean"] == pytest.approx(0.4) and o["final_accuracy"]["mean"] == pytest.approx(0.4)
    assert g["gain"]["mean"] == pytest.approx(0.2)
    assert o["reached_ref"] == "1/2" and o["steps_to_ref"]["mean"] == 10 and o["seconds_to_ref"]["mean"] == 5.0
    assert g["step_time"]["mean"] == 1.0 and o["step_time"]["mean"] == 1.5 and o["final_entropy"]["mean"] == 0.6
    assert o["matched_step"] == 30 and o["matched_accuracy"]["mean"] == pytest.approx(0.4)
    assert o["ref_matched_accuracy"]["mean"] == pytest.approx(0.45)
    assert o["matched_diff"]["mean"] == pytest.approx(-0.05)
    # Welch: variances 0.02 (oar-g finals 0.5, 0.3) and 0 (grpo) -> se 0.1, df 1 -> t 12.706
    assert o["final_diff"]["mean"] == pytest.approx(0.0) and o["final_diff"]["ci95"] == pytest.approx(1.2706)
    table = format_results_table(res)
    assert "| grpo | 20.0 ± 0.0 [±0.0] → 40.0 ± 0.0 [±0.0] | 20.0 ± 0.0 [±0.0] | +0.0 [±0.0] | 30 " in table
    assert "| oar-g |" in table and "40.0 ± 14.1 [±127.1] vs 45.0 ± 7.1 [±63.5]: -5.0" in table


def test_matched_step_interpolates_a_shorter_run_against_the_reference(tmp_path):
    dirs = {("grpo", 0): _fake_run(tmp_path / "g0", [0.2, 0.3, 0.5, 0.6], 1.0, 0.5),  # steps 0..30
            ("oar-p", 0): _fake_run(tmp_path / "p0", [0.2, 0.4], 3.0, 0.5)}  # steps 0, 10
    rows = [json.loads(x) for x in (dirs[("oar-p", 0)] / "metrics.jsonl").read_text().splitlines()]
    rows[-1]["step"] = 14  # stopped by the budget between two evaluation steps
    (dirs[("oar-p", 0)] / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    p = summarize_comparison(dirs)["credits"]["oar-p"]
    assert p["matched_step"] == 14 and p["matched_accuracy"]["mean"] == pytest.approx(0.4)
    assert p["ref_matched_accuracy"]["mean"] == pytest.approx(0.3 + 0.2 * 4 / 10)
    assert math.isnan(p["matched_diff"]["ci95"])  # one seed: no interval


def test_final_accuracy_never_averages_in_the_start_evaluation(tmp_path):
    """A run the budget stops before its second evaluation (OAR-P in the regime study: evaluations at steps 0
    and 6) has the accuracy at its end as its final, not the mean with the warm start's."""
    dirs = {("grpo", 0): _fake_run(tmp_path / "g0", [0.2, 0.3, 0.5], 1.0, 0.5),
            ("oar-p", 0): _fake_run(tmp_path / "p0", [0.2, 0.4], 3.0, 0.5),
            ("oar-g", 0): _fake_run(tmp_path / "o0", [0.2], 1.5, 0.5),  # no update made: final = start
            ("random", 0): _fake_run(tmp_path / "r0", [0.2, 0.3, 0.5], 1.0, 0.5)}
    res = summarize_comparison(dirs)["credits"]
    assert res["oar-p"]["final_accuracy"]["mean"] == pytest.approx(0.4)
    assert res["grpo"]["final_accuracy"]["mean"] == pytest.approx(0.4)  # mean of the evaluations at 10 and 20
    assert res["oar-g"]["final_accuracy"]["mean"] == pytest.approx(0.2)
    rows = [json.loads(x) for x in (dirs[("random", 0)] / "metrics.jsonl").read_text().splitlines()]
    (dirs[("random", 0)] / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows[1:]))  # no step-0 eval
    assert summarize_comparison(dirs)["credits"]["random"]["final_accuracy"]["mean"] == pytest.approx(0.4)


def test_bad_arguments_raise_naming_the_value(tmp_path, capsys):
    with pytest.raises(ValueError, match="'ppo'"):
        compare(tmp_path, base_config(PRESETS["default"]), ("grpo", "ppo"), seeds=1)
    with pytest.raises(ValueError, match="preset must be one of .*'huge'"):
        get_preset("huge")
    with pytest.raises(ValueError, match=r"overrides: unknown field\(s\) 'budget'"):
        base_config(PRESETS["default"], overrides={"budget": 3})
    with pytest.raises(ValueError, match=r"task overrides: unknown field\(s\) 'verbose'"):
        base_config(PRESETS["default"], overrides={"task": {"verbose": 1}})
    assert main(["compare", "--address", "10.0.0.1:6379", "--retries", "1", "--out", str(tmp_path)]) == 2
    assert "--address, --retries needs --backend ray" in capsys.readouterr().err
    assert main(["compare", "--seeds", "0", "--out", str(tmp_path)]) == 2
    assert "seeds must be between 1 and 1000, got 0" in capsys.readouterr().err
    assert main(["compare", "--max-steps", "0", "--out", str(tmp_path)]) == 2
    assert "max_steps must be >= 1, got 0" in capsys.readouterr().err
    assert main(["compare", "--regime", "long-b8", "--out", str(tmp_path)]) == 2
    assert "unknown regime 'long-b8'; regimes: default" in capsys.readouterr().err
    for column, message in (("gtpo@alpha1=NaN", "credit 'gtpo': alpha1 must be a finite number, got nan"),
                            ("oar-g@noise_std=0&mode=last", "noise_std must be > 0 unless mode is 'answer_joint'")):
        assert main(["compare", "--credits", f"grpo,{column}", "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_ray_options_and_failures_are_named(monkeypatch, tmp_path, capsys):
    """The Ray backend's checks, before any work, and the words of a failed study (no Ray needed)."""
    import importlib.util

    from oar.lab.compare import RunsFailed
    from oar.lab.ray_pool import RayOptions, describe_error

    with pytest.raises(ValueError, match="retries must be >= 0, got -1"):
        RayOptions(retries=-1).check()
    with pytest.raises(ValueError, match="gpus_per_run must be >= 0, got -0.5"):
        RayOptions(gpus_per_run=-0.5).check()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert main(["compare", "--quick", "--backend", "ray", "--out", str(tmp_path / "r")]) == 2
    assert "--backend ray needs Ray, which is not installed: pip install 'oar-rl[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # refused before anything was written

    class TaskError(Exception):  # what Ray raises for a task that raised: the task's exception as its cause
        cause = RuntimeError("deliberately broken\n  traceback lines")

    assert describe_error(TaskError("wrapped")) == "RuntimeError: deliberately broken"
    assert describe_error(OSError("x" * 400)).endswith("...") and len(describe_error(OSError("x" * 400))) == 300
    err = RunsFailed({"oar-g-s1": ["WorkerCrashedError: killed", "RuntimeError: boom"]}, {"runs": []}, tmp_path)
    assert str(err) == (f"1 run(s) failed every attempt: oar-g-s1 (2 attempts, last: RuntimeError: boom); the "
                        f"results of the other runs are in {tmp_path}; --resume trains only the runs that did not "
                        "finish")


def test_a_warm_start_travels_as_files_and_installs_once(tmp_path):
    """What the Ray backend ships through the object store: a cache entry's files, installed into another
    machine's cache unless that holds the entry already (no training, no torch)."""
    from oar.lab.warmstart import cache_entry, cached_files, install_warm_start

    cfg = WarmStartConfig(steps=3)
    src = cache_entry(cfg, tmp_path / "a")
    (src / "sub").mkdir(parents=True)
    (src / "info.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"\x00weights")
    (src / "sub" / "part.bin").write_bytes(b"part")
    files = cached_files(src)
    assert files == {"info.json": b"{}", "model.safetensors": b"\x00weights", "sub/part.bin": b"part"}
    dst = install_warm_start(cfg, files, tmp_path / "b")
    assert dst == cache_entry(cfg, tmp_path / "b") and cached_files(dst) == files
    assert install_warm_start(cfg, {"info.json": b"other"}, tmp_path / "b") == dst  # kept as it was
    assert cached_files(dst) == files and not [p for p in dst.parent.iterdir() if p.name.startswith(".")]


def test_presets_fit_their_budgets():
    q, d, s = PRESETS["quick"], PRESETS["default"], PRESETS["study"]
    assert len(q.credits) * q.seeds * q.budget_s <= 2 * 60  # 2 workers, ≤ 3 min wall with start-up and evals
    assert len(d.credits) >= 2 and d.seeds >= 2 and len(s.credits) == 3 and s.seeds >= 5


def test_base_config_takes_every_override_in_one_dict():
    """Precedence preset < regime < overrides; ``warm`` replaces the preset's warm start under the regime's
    task, ``task`` applies over the regime's task."""
    warm = WarmStartConfig(steps=7)
    base = base_config(PRESETS["quick"], "terse", {"budget_s": 5.0, "max_steps": 3, "clock": "wall", "warm": warm})
    assert (base.budget_s, base.max_steps, base.clock, base.eval_problems) == (5.0, 3, "wall", 64)
    assert base.warm.steps == 7 and base.warm.task.verbosity == 0  # the regime's task over the given warm start
    assert base_config(PRESETS["quick"], "terse", {"task": {"verbosity": 2}}).warm.task.verbosity == 2
    assert base_config(PRESETS["quick"]).warm.steps == 250 and base_config(PRESETS["default"]).budget_s == 240.0
    with pytest.raises(TypeError):
        PRESETS["quick"].__class__(("grpo",), 1, 30.0, 10, 64, 2)  # keyword-only


def _tiny_base(**overrides):
    """A base configuration small enough for an end-to-end comparison in seconds (one layer, 32 wide)."""
    warm = WarmStartConfig(task=TaskConfig(verbosity=1, slip_rate=0.1), model=ModelConfig(hidden=32, layers=1, mlp=64),
                           steps=40, batch_size=16, lr=1e-2, warmup=5)
    return base_config(PRESETS["quick"], overrides={
        "eval_problems": 16, "eval_k": 1, "eval_every": 2, "prompts_per_step": 2, "group_size": 4,
        "max_completion_length": 48, "budget_s": 3, "warm": warm, **overrides})


@pytest.mark.slow
def test_tiny_end_to_end_compare(tmp_path):
    base, cache = _tiny_base(), tmp_path / "cache"
    res = compare(tmp_path / "out", base, ("grpo", "oar-g"), seeds=1, workers=1, cache_dir=cache, report=False)
    assert set(res["credits"]) == {"grpo", "oar-g"}
    for credit in ("grpo", "oar-g"):
        run = tmp_path / "out" / f"{credit}-s0"
        meta = json.loads((run / "run.json").read_text())
        assert meta["credit"] == credit and meta["seed"] == 0
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert rows[0]["step"] == 0 and "eval/accuracy" in rows[0] and any("step_time" in r for r in rows)
    for c in ("grpo", "oar-g"):  # the tiny model never scores a reward, so only the wiring is checked here
        assert 0.0 <= res["credits"][c]["importance_share"]["mean"] < 1.0
        assert res["credits"][c]["steps"]["mean"] >= 1
    assert json.loads((tmp_path / "out" / "results.json").read_text())["seeds"] == 1
    assert "| oar-g |" in (tmp_path / "out" / "results.md").read_text()

    # --resume keeps finished runs of the same configuration and retrains the ones whose configuration changed
    stamp = {c: (tmp_path / "out" / f"{c}-s0" / "summary.json").stat().st_mtime_ns for c in ("grpo", "oar-g")}
    again = compare(tmp_path / "out", base, ("grpo", "oar-g"), seeds=1, workers=1, cache_dir=cache, report=False,
                    resume=True)
    assert again["credits"]["grpo"]["final_accuracy"]["mean"] == res["credits"]["grpo"]["final_accuracy"]["mean"]
    assert all((tmp_path / "out" / f"{c}-s0" / "summary.json").stat().st_mtime_ns == t for c, t in stamp.items())
    compare(tmp_path / "out", _tiny_base(budget_s=2), ("grpo",), seeds=1, workers=1, cache_dir=cache, report=False,
            resume=True)
    assert (tmp_path / "out" / "grpo-s0" / "summary.json").stat().st_mtime_ns != stamp["grpo"]

    # a column with options trains that credit with them, in its own run directory
    compare(tmp_path / "out", _tiny_base(budget_s=2), ("oar-g@beta=2",), seeds=1, workers=1, cache_dir=cache,
            report=False)
    meta = json.loads((tmp_path / "out" / "oar-g@beta=2-s0" / "run.json").read_text())
    assert meta["credit"] == "oar-g@beta=2" and meta["lab"]["credit"] == "oar-g@beta=2"  # one value, whole
    assert meta["config"]["credit_options"] is None and meta["config"]["oar_beta"] is None

    # an oracle column trains through the lab trainer like any credit and brings credit efficiency into the results
    res = compare(tmp_path / "out", _tiny_base(budget_s=2), ("grpo", "oracle-process"), seeds=1, workers=1,
                  cache_dir=cache, report=False, resume=True)
    oracle = res["credits"]["oracle-process"]
    assert oracle["steps"]["mean"] >= 1 and oracle["best_oracle"] == "oracle-process"
    assert res["credits"]["grpo"]["efficiency_step"] >= 1 and "efficiency_updates" in res["credits"]["grpo"]


def test_credit_columns_carry_their_options_and_name_bad_ones():
    assert credit_columns(("oar-g",)) == {"oar-g": CreditSpec("oar-g")}
    cols = credit_columns(("OAR-G@beta=2&tau=0.5", "oar-p@mode=last", "oar-p@horizon=2&chunk_size=64", "oar-g"))
    assert list(cols) == ["oar-g@beta=2&tau=0.5", "oar-p@mode=last", "oar-p@horizon=2&chunk_size=64", "oar-g"]
    assert dict(cols["oar-g@beta=2&tau=0.5"].options) == {"beta": 2, "tau": 0.5}
    assert list(credit_columns(("grpo", " grpo "))) == ["grpo"]  # the same column twice counts once
    with pytest.raises(ValueError, match="gamma"):
        credit_columns(("oar-g@gamma=1",))
    with pytest.raises(ValueError, match="'beta'"):
        credit_columns(("oar-g@beta",))
    with pytest.raises(ValueError, match="'ppo'"):
        credit_columns(("ppo@beta=2",))
    with pytest.raises(ValueError, match="must not contain"):
        credit_columns(("oar-p@mode=../x",))
    with pytest.raises(ValueError, match="noise_std must be > 0 unless mode is 'answer_joint'"):
        credit_columns(("grpo", "oar-g@noise_std=0&mode=last"))  # a rule between options, before any run
    for column in ("oar-g", "oar-g@beta=2&tau=0.5", "oar-p@mode=last", "oar-p@horizon=2",
                   "oar-p@horizon=2&chunk_size=64"):
        assert str(CreditSpec.parse(column)) == column  # format is the inverse of parse: the stored column names


def test_finished_runs_of_an_older_oar_still_count_on_resume(tmp_path):
    """An older oar recorded a column's options in the lab config's ``oar.credit_options`` (``credit`` the name
    alone); ``--resume`` reads that as the same one credit value, and a different value as another run."""
    from dataclasses import asdict

    from oar.lab.compare import finished_run

    cfg = RunConfig(credit="oar-p@horizon=2&chunk_size=64", budget_s=30.0, eval_every=10)
    final = {"step": 3, "wall_time": 31.0, "eval/accuracy": 0.5}
    old_lab = {**json.loads(json.dumps(asdict(cfg))), "credit": "oar-p",
               "oar": {"credit_options": {"horizon": 2, "chunk_size": 64}}}
    for name, lab in (("old", old_lab), ("new", asdict(cfg))):
        d = tmp_path / name
        d.mkdir()
        (d / "run.json").write_text(json.dumps({"lab": lab, "credit_defaults": credit_defaults(cfg)}))
        (d / "metrics.jsonl").write_text(json.dumps(final) + "\n")
        (d / "summary.json").write_text(json.dumps({"final": final}))
        assert finished_run(d, cfg), name
    assert not finished_run(tmp_path / "old", RunConfig(credit="oar-p@horizon=3&chunk_size=64", budget_s=30.0,
                                                        eval_every=10))


@pytest.mark.parametrize("clock, stops", [("cpu", False), ("wall", True)])
def test_the_cpu_clock_does_not_count_time_the_run_waits(clock, stops):
    """A step that only waits (another job holds the core) spends wall-clock time but no CPU time."""
    cb = LabCallback({}, evaluate=lambda step: {}, budget_s=0.15, eval_every=1000, clock=clock)
    state, control = SimpleNamespace(global_step=1), SimpleNamespace(should_training_stop=False)
    cb.on_step_begin(None, state, control)
    time.sleep(0.3)
    cb.on_step_end(None, state, control)
    assert control.should_training_stop is stops
    assert (cb.train_s >= 0.3) is stops
    with pytest.raises(ValueError, match="'gpu'"):
        RunConfig(clock="gpu")


def test_terminal_summary_is_compact_and_names_both_differences(tmp_path):
    from rich.console import Console

    from oar.lab.summary import terminal_summary

    dirs = {("grpo", 0): _fake_run(tmp_path / "g0", [0.2, 0.3, 0.4, 0.4], 1.0, 0.5),
            ("grpo", 1): _fake_run(tmp_path / "g1", [0.2, 0.3, 0.3, 0.5], 1.0, 0.4),
            ("oar-g", 0): _fake_run(tmp_path / "o0", [0.2, 0.45, 0.5, 0.5], 1.5, 0.6),
            ("oar-g", 1): _fake_run(tmp_path / "o1", [0.2, 0.2, 0.3, 0.3], 1.5, 0.6)}
    res = {**summarize_comparison(dirs), "seeds": 2}
    console = Console(record=True, width=80, color_system=None)
    console.print(terminal_summary(res))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert max(map(len, lines)) <= 80 and lines[0] == "held-out accuracy, points (± 95% CI over 2 seeds)"
    # final 40.0 ± 127.1 (t(1) 12.706 × 0.1414 / √2), Δ at the same budget; at step 30: 40 vs 45, Welch se
    # √(0.02/2 + 0.005/2) = 0.1118 with df 1.47 -> t(1): ±142.1
    assert lines[3].split() == ["oar-g", "40.0", "±", "127.1", "+0.0", "[±127.1]", "-5.0", "[±142.1]", "@30",
                                "1.50"]
    assert lines[2].split() == ["grpo", "40.0", "±", "0.0", "–", "–", "1.00"]
    assert "oracle" not in console.export_text()
    console = Console(record=True, width=80, color_system=None)
    console.print(terminal_summary({**res, "seeds": 3, "warm_seeds": 2}))  # the unit is (warm start, seed)
    text = console.export_text()
    assert text.splitlines()[0].rstrip() == "held-out accuracy, points (± 95% CI over 6 units)"
    assert "a unit: a (warm start, RL seed) pair" in " ".join(text.split())
    dirs[("oracle-process", 0)] = _fake_run(tmp_path / "p0", [0.2, 0.5, 0.6, 0.6], 1.0, 0.5)
    dirs[("oracle-process", 1)] = _fake_run(tmp_path / "p1", [0.2, 0.4, 0.5, 0.7], 1.0, 0.5)
    console = Console(record=True, width=80, color_system=None)
    console.print(terminal_summary({**summarize_comparison(dirs), "seeds": 2}))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    # at step 30, oar-g's gaps to grpo (+0.1, -0.2) over the oracle's (+0.2, +0.2): -0.1 / 0.4
    assert max(map(len, lines)) <= 80 and lines[3].split()[-1] == "-0.25" and lines[4].split()[-1] == "+1.00"
    assert lines[4].split()[:3] == ["oracle-process", "60.0", "±"]  # nothing truncated


def test_headroom_stats_by_hand():
    from oar.lab.stats import accuracy_at, first_reach, mean_accuracy_until, ratio_ci

    curve = [(0, 0.0, 0.2), (10, 5.0, 0.4), (20, 10.0, 0.4)]
    assert accuracy_at(curve, 5) == pytest.approx(0.3) and accuracy_at(curve, 2.5, axis=1) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="second 11 is outside"):
        accuracy_at(curve, 11, axis=1)
    assert mean_accuracy_until(curve, 20) == pytest.approx((0.3 * 10 + 0.4 * 10) / 20)
    assert mean_accuracy_until(curve, 15) == pytest.approx((0.3 * 10 + 0.4 * 5) / 15)
    assert mean_accuracy_until(curve, 5.0, axis=1) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="outside"):
        mean_accuracy_until(curve, 25)
    assert first_reach(curve, 0.3) == pytest.approx(5.0) and first_reach(curve, 0.5) is None
    assert first_reach(curve, 0.1) == 0.0 and first_reach(curve, 0.35, axis=1) == pytest.approx(3.75)
    r = ratio_ci({0: 1.0, 1: 3.0}, {0: 2.0, 1: 2.0})
    assert r["mean"] == pytest.approx(1.0) and r["lo"] <= 0.5 + 1e-9 and r["hi"] >= 1.5 - 1e-9 and r["n"] == 2
    assert ratio_ci({0: 1.0}, {0: -1.0})["mean"] is None  # no headroom: no share of it


def test_headroom_metrics_and_credit_efficiency(tmp_path):
    runs = {"grpo": ([0.2, 0.3, 0.4, 0.5], [0.2, 0.3, 0.4, 0.5]),
            "oracle-blame": ([0.2, 0.5, 0.7, 0.7], [0.2, 0.4, 0.6, 0.7]),
            "oracle-oar": ([0.2, 0.3, 0.5, 0.5], [0.2, 0.3, 0.5, 0.6]),
            "oar-g": ([0.2, 0.4, 0.5, 0.6], [0.2, 0.3, 0.4, 0.5])}
    dirs = {(c, s): _fake_run(tmp_path / f"{c}{s}", accs[s], 1.0, 0.5) for c, accs in runs.items() for s in (0, 1)}
    res = summarize_comparison(dirs)
    a = res["credits"]
    # mean accuracy over 30 updates (trapezoids): grpo (0.25 + 0.35 + 0.45) / 3
    assert a["grpo"]["auc_updates"]["mean"] == pytest.approx(0.35)
    blame = ((0.35 + 0.6 + 0.7) / 3 + (0.3 + 0.5 + 0.65) / 3) / 2
    assert a["oracle-blame"]["auc_updates_diff"]["mean"] == pytest.approx(blame - 0.35)
    assert a["oracle-blame"]["auc_seconds"]["mean"] == pytest.approx(a["oracle-blame"]["auc_updates"]["mean"])
    # 90% of grpo's gain (0.2 -> 0.45 final): 0.425; grpo reaches it between steps 20 and 30 (0.4 -> 0.5)
    assert a["grpo"]["steps_to_gain"]["mean"] == pytest.approx(22.5) and a["grpo"]["reached_gain"] == "2/2"
    assert a["oracle-blame"]["steps_to_gain"]["mean"] == pytest.approx((0.225 / 0.3 * 10 + 10 + 0.025 / 0.2 * 10) / 2)
    # every run of both reached it: the Welch difference of the times (7.5, 11.25 against 22.5, 22.5; 0.5 s an update)
    assert a["oracle-blame"]["steps_to_gain_diff"]["mean"] == pytest.approx((7.5 + 11.25) / 2 - 22.5)
    assert a["oracle-blame"]["seconds_to_gain_diff"]["mean"] == pytest.approx(((7.5 + 11.25) / 2 - 22.5) / 2)
    # best oracle = oracle-blame; finals (last two evals): blame 0.7 / 0.65, grpo 0.45 / 0.45, oar-g 0.55 / 0.45
    assert a["oar-g"]["best_oracle"] == "oracle-blame" and a["oar-g"]["efficiency_step"] == 30
    assert a["oar-g"]["efficiency_updates"]["mean"] == pytest.approx((0.1 + 0.0) / (0.2 + 0.2))
    assert a["oar-g"]["efficiency_budget"]["mean"] == pytest.approx(0.05 / 0.225)
    assert a["oracle-blame"]["efficiency_updates"]["mean"] == pytest.approx(1.0)
    assert a["grpo"]["efficiency_updates"]["mean"] == pytest.approx(0.0)
    table = format_results_table(res)
    assert "Best oracle: oracle-blame" in table and "| 0.25 [0.00, 0.50] @30 | 0.22 [" in table


def test_efficiency_table_applies_the_declared_claim_rule(tmp_path):
    """oar.lab.efficiency: a credit captures headroom only with its Welch CI and its efficiency interval both above
    0; "below GRPO" when the Welch CI lies under 0; the table, JSON and plot are written."""
    from oar.lab import efficiency as eff

    up, flat, down = {"mean": 0.1, "ci95": 0.05}, {"mean": 0.1, "ci95": 0.2}, {"mean": -0.1, "ci95": 0.05}
    assert eff.verdict(up, {"mean": 0.5, "lo": 0.1, "hi": 0.9}) == "captures headroom"
    assert eff.verdict(up, {"mean": 0.5, "lo": -0.1, "hi": 0.9}) == "not distinguishable"
    assert eff.verdict(flat, {"mean": 0.5, "lo": 0.1, "hi": 0.9}) == "not distinguishable"
    assert eff.verdict(down, None) == "below GRPO" and eff.verdict(None, None) == "not distinguishable"
    assert eff.verdict(up, {"mean": 0.5, "lo": 0.1, "hi": 0.9}, "pays at equal compute") == "pays at equal compute"

    runs = {"grpo": [[0.2, 0.3, 0.4, 0.4], [0.2, 0.3, 0.4, 0.5], [0.2, 0.3, 0.3, 0.4]],
            "oracle-process": [[0.2, 0.5, 0.7, 0.7], [0.2, 0.5, 0.7, 0.8], [0.2, 0.6, 0.7, 0.7]],
            "oar-g": [[0.2, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2, 0.1], [0.2, 0.1, 0.2, 0.2]]}
    out = tmp_path / "cmp"
    dirs = {(c, s): _fake_run(out / f"{c}-s{s}", accs[s], 1.0, 0.5) for c, accs in runs.items() for s in range(3)}
    results = summarize_comparison(dirs)
    results["config"] = {"prompts_per_step": 4, "group_size": 4}
    (out / "results.json").write_text(json.dumps(results))
    (out / "results.md").write_text(format_results_table(results))
    assert eff.write_efficiency(out, tmp_path / "eff") == tmp_path / "eff" / "efficiency.md"
    rows = {r["credit"]: r for r in json.loads((tmp_path / "eff" / "efficiency.json").read_text())["rows"]}
    assert rows["oracle-process"]["verdict_updates"] == "captures headroom"
    assert rows["oar-g"]["verdict_updates"] == "below GRPO" and rows["oar-g"]["efficiency_updates"]["mean"] < 0
    # oar-g never reaches 90 % of GRPO's gain: no time to compare, so no difference (censored, not dropped)
    cr = results["credits"]
    assert cr["oar-g"]["reached_gain"] == "0/3" and cr["oar-g"]["steps_to_gain_diff"] is None
    assert cr["oracle-process"]["steps_to_gain_diff"]["mean"] < 0
    assert rows["grpo"]["cost_vs_ref"] == pytest.approx(1.0) and rows["grpo"]["verdict_updates"] is None
    assert rows["oar-g"]["importance_share"] is None and rows["oar-g"]["completion_tokens"] is None  # not logged
    assert "| grpo | 3 |" in (tmp_path / "eff" / "efficiency.md").read_text()
    assert "| reference |" in (tmp_path / "eff" / "efficiency.md").read_text()
    assert "Best oracle: `oracle-process`" in (tmp_path / "eff" / "efficiency.md").read_text()
    assert (tmp_path / "eff" / "efficiency.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "eff" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    # a max_steps cap that stopped every run: the budget view is not equal compute, and says so
    steps = {r["steps"] for r in results["runs"]}
    assert eff.budget_binds(results) and eff.budget_binds({**results, "config": {"max_steps": max(steps) + 1}})
    capped = {**results, "config": {**results["config"], "max_steps": min(steps)}}
    assert not eff.budget_binds(capped)
    rows = {r["credit"]: r for r in eff.efficiency_rows(capped)}
    assert rows["oracle-process"]["verdict_updates"] == "captures headroom"
    assert rows["oracle-process"]["verdict_budget"] == f"no budget view (every run stopped at {min(steps)} updates)"
    assert "not equal compute" in eff.markdown(capped, list(rows.values()))
    assert "not equal compute" not in (tmp_path / "eff" / "efficiency.md").read_text()
    with pytest.raises(ValueError, match="is the compare directory itself"):  # refused before anything is written
        eff.write_efficiency(out, out)
    assert not (out / "efficiency.json").exists()


def test_no_oracle_means_no_efficiency(tmp_path):
    dirs = {("grpo", 0): _fake_run(tmp_path / "g0", [0.2, 0.3, 0.4], 1.0, 0.5),
            ("oar-g", 0): _fake_run(tmp_path / "o0", [0.2, 0.4, 0.4], 1.0, 0.5)}
    a = summarize_comparison(dirs)["credits"]["oar-g"]
    assert "efficiency_updates" not in a and a["auc_updates_diff"]["mean"] == pytest.approx(0.05)


def test_import_option_registers_a_user_credit_in_the_parent_and_in_spawned_workers(user_credit_module, tmp_path,
                                                                                     capsys):
    from oar.credit import credit_names
    from oar.lab.pool import worker_pool

    assert "user-first" not in credit_names()
    # the parent imports the module before it builds the columns: the user's option is checked, not "unknown"
    with pytest.raises(ValueError, match="no option.*nope"):
        compare(tmp_path / "c", base_config(PRESETS["quick"]), ("user-first@nope=1",), seeds=1,
                imports=(user_credit_module,))
    with worker_pool(1, imports=(user_credit_module,)) as pool:  # a spawned process: built-ins only, then imports
        assert "user-first" in pool.submit(credit_names).result(timeout=120)
    with worker_pool(1) as pool:
        assert "user-first" not in pool.submit(credit_names).result(timeout=120)
    assert main(["compare", "--quick", "--import", "no_such_module_x", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "no_such_module_x" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()


def test_stored_study_columns_read_back_as_the_same_columns():
    """Every column of every stored study (docs/studies/*/results) is its own canonical credit text, so rerunning
    or resuming the study names the same run directories and results, and a report groups a run directory of either
    run.json form (an older oar's name + ``config.credit_options``, or the credit whole) under that column."""
    import oar.lab  # noqa: F401  (the oracle columns)
    from oar.viz.plots import Run

    root = Path(__file__).resolve().parents[1] / "docs" / "studies"
    stored = [json.loads(p.read_text()) for p in sorted(root.glob("*/results/*.json"))
              + sorted(root.glob("*/results/*/results.json"))]
    columns = [c for r in stored if isinstance(r, dict) and "reference" in r and "credits" in r for c in r["credits"]]
    assert "oar-p@horizon=2&chunk_size=64" in columns and len(columns) > 40
    assert list(credit_columns(tuple(dict.fromkeys(columns)))) == list(dict.fromkeys(columns))
    for c in columns:
        spec = CreditSpec.parse(c)
        older = Run(Path(c), {"credit": spec.name, "config": {"credit_options": dict(spec.options) or None}})
        assert older.credit == Run(Path(c), {"credit": str(spec), "config": {}}).credit == c


@pytest.mark.slow
def test_warm_seeds_make_warm_start_by_rl_seed_units(tmp_path):
    """``warm_seeds=2``: each warm start is built once (its own seed, cached), every column runs the RL seeds from
    each, warm start 0's runs keep their names (so an earlier one-warm-start study resumes into it), and the
    results are over the (warm start, RL seed) units."""
    cache = tmp_path / "cache"
    first = compare(tmp_path / "out", _tiny_base(budget_s=2), ("grpo",), seeds=1, workers=1, cache_dir=cache,
                    report=False)
    res = compare(tmp_path / "out", _tiny_base(budget_s=2), ("grpo",), seeds=1, workers=1, cache_dir=cache,
                  report=False, resume=True, warm_seeds=2)
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir()) == ["grpo-s0", "grpo-w1-s0"]
    assert res["warm_seeds"] == 2 and len(set(res["warm_starts"])) == 2
    meta = [json.loads((tmp_path / "out" / d / "run.json").read_text())["lab"]["warm"]["seed"]
            for d in ("grpo-s0", "grpo-w1-s0")]
    assert meta == [0, 1]
    assert res["credits"]["grpo"]["final_accuracy"]["n"] == 2  # two units
    assert first["credits"]["grpo"]["final_accuracy"]["n"] == 1
    assert "(warm start, RL seed) units" in (tmp_path / "out" / "results.md").read_text()
    with pytest.raises(ValueError, match="warm_seeds must be between 1 and 1000"):
        compare(tmp_path / "bad", _tiny_base(), ("grpo",), seeds=1, warm_seeds=0)


def test_the_start_evaluation_is_computed_once_per_warm_start_and_changes_nothing(tmp_path):
    """A warm start's step-0 evaluation is stored beside it by its first run and read by the next: the second run
    (another RL seed) records the same start and trains exactly as it would have (same sampled lengths, losses and
    evaluations at every step); a stored value is what a run reports (the file is really read); another evaluation
    setting is another file."""
    from oar.lab.run import train_lab

    cache = tmp_path / "cache"
    base = _tiny_base(budget_s=600, max_steps=4)
    timing = ("time", "runtime", "per_second", "share")  # wall-clock readings

    def rows(run):
        return [{k: v for k, v in json.loads(line).items() if not any(t in k for t in timing)}
                for line in (run / "metrics.jsonl").read_text().splitlines()]

    train_lab(base, tmp_path / "fresh", cache)  # computes and stores the start evaluation
    stored = list((cache / "start-eval").glob("*.json"))
    assert len(stored) == 1
    assert json.loads(stored[0].read_text()) == {k[5:]: v for k, v in rows(tmp_path / "fresh")[0].items()
                                                 if k.startswith("eval/")}
    stored[0].unlink()
    train_lab(base, tmp_path / "uncached", cache)  # computes it again ...
    train_lab(base, tmp_path / "cached", cache)  # ... and this run reads it
    assert rows(tmp_path / "cached") == rows(tmp_path / "uncached") == rows(tmp_path / "fresh")
    assert len(rows(tmp_path / "cached")) > 3
    assert json.loads((tmp_path / "cached" / "summary.json").read_text())["start"]["eval_time"] < 0.05

    stored[0].write_text(json.dumps({"accuracy": 0.123}))
    train_lab(base, tmp_path / "planted", cache)
    assert rows(tmp_path / "planted")[0]["eval/accuracy"] == 0.123
    train_lab(_tiny_base(budget_s=600, max_steps=1, eval_k=2), tmp_path / "other", cache)
    assert len(list((cache / "start-eval").glob("*.json"))) == 2
