"""Run reports: loading run directories, bands over seeds, plots and report.md."""

from __future__ import annotations

import json

import numpy as np
import pytest

from oar.viz.plots import band, expand_run_dirs, load_run, metric_keys, plot_metric, slug, step_time_breakdown
from oar.viz.report import markdown_table, results_markdown, write_report

PNG = b"\x89PNG\r\n\x1a\n"


def make_run(root, name, credit, seed, acc_end, steps=(0, 10, 20, 30), step_s=0.5, extra=None):
    d = root / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"credit": credit, "seed": seed, "model": "tiny"}))
    rows = []
    for i, s in enumerate(steps):
        frac = i / (len(steps) - 1)
        rows.append({"step": s, "wall_time": 100.0 + s * step_s, "reward": 0.2 + frac * acc_end,
                     "entropy": 1.0 - 0.1 * frac, "eval/accuracy": 0.5 + frac * (acc_end - 0.5), **(extra or {})})
    rows.append({"step": steps[-1], "train_runtime": 12.0})  # a one-off row: not a curve
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


@pytest.fixture
def runs_root(tmp_path):
    root = tmp_path / "compare"
    for seed, acc in enumerate((0.6, 0.7, 0.8)):
        make_run(root, f"oar-g-{seed}", "oar-g", seed, acc, extra={"oar/ess_ratio": 0.8})
    for seed, acc in enumerate((0.5, 0.6)):
        make_run(root, f"grpo-{seed}", "grpo", seed, acc, steps=(0, 5, 20, 25, 30), step_s=0.25)
    return root


def test_load_and_series(runs_root):
    run = load_run(runs_root / "grpo-1")
    assert run.credit == "grpo" and run.seed == 1 and run.name == "grpo-1"
    x, y = run.series("eval/accuracy")
    assert x.tolist() == [0, 5, 20, 25, 30] and y[-1] == pytest.approx(0.6)
    x, y = run.series("reward", "wall_time")
    assert x.tolist() == [0, 1.25, 5, 6.25, 7.5]  # seconds since the first row
    x, y = run.series("step_time")  # derived: d wall_time / d step
    assert x.tolist() == [5, 20, 25, 30] and np.allclose(y, 0.25)
    keys = metric_keys([run])
    assert keys[:4] == ["eval/accuracy", "reward", "entropy", "step_time"] and "train_runtime" not in keys


def test_runs_of_one_method_under_other_options_form_their_own_group(runs_root):
    """A compare column with options (``oar-p@horizon=2``) is not pooled with the plain method in the figures."""
    from oar.viz.plots import group_runs

    d = make_run(runs_root, "oar-g@beta=2-0", "oar-g", 0, 0.9)
    meta = json.loads((d / "run.json").read_text())
    (d / "run.json").write_text(json.dumps({**meta, "config": {"credit_options": {"beta": 2}}}))
    runs = [load_run(runs_root / n) for n in ("oar-g-0", "oar-g-1", "oar-g@beta=2-0")]
    assert runs[2].credit == "oar-g@beta=2" and runs[0].credit == "oar-g"
    assert {k: len(v) for k, v in group_runs(runs).items()} == {"oar-g": 2, "oar-g@beta=2": 1}


def test_band_interpolates_onto_the_shared_range():
    a = (np.array([0.0, 10.0, 20.0]), np.array([0.0, 1.0, 2.0]))
    b = (np.array([0.0, 5.0, 15.0]), np.array([1.0, 1.0, 1.0]))
    x, mean, lo, hi = band([a, b])
    assert x.tolist() == [0, 5, 10, 15]  # b ends at 15
    assert mean.tolist() == pytest.approx([0.5, 0.75, 1.0, 1.25])
    assert lo.tolist() == pytest.approx([0.0, 0.5, 1.0, 1.0]) and hi.tolist() == pytest.approx([1.0, 1.0, 1.0, 1.5])
    x, mean, lo, hi = band([a])
    assert mean is a[1] and lo is a[1]


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="run directory not found"):
        expand_run_dirs([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no metrics.jsonl"):
        expand_run_dirs([tmp_path / "empty"])
    d = tmp_path / "r"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"step": 1, "reward": 1}\n{"step": 2, "rew')  # a run still writing
    run = load_run(d)
    assert len(run.rows) == 1 and run.credit == "r"
    (d / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        load_run(d)


def test_plot_metric_writes_png(runs_root, tmp_path):
    runs = [load_run(d) for d in expand_run_dirs([runs_root])]
    assert len(runs) == 5
    out = plot_metric(runs, "eval/accuracy", tmp_path / "p" / f"{slug('eval/accuracy')}.png", x="wall_time")
    assert out.name == "eval_accuracy.png" and out.read_bytes().startswith(PNG)
    with pytest.raises(ValueError, match="x must be"):
        plot_metric(runs, "reward", tmp_path / "x.png", x="epoch")


def test_markdown_tables():
    assert markdown_table(["a", "b|c"], [[1.23456, None]]) == "| a | b\\|c |\n|---|---|\n| 1.235 |  |"
    md = results_markdown({"grpo": {"acc": {"mean": 0.5, "std": 0.01}, "n": 3}, "oar-g": {"acc": 0.61}})
    assert md.splitlines() == ["|  | acc | n |", "|---|---|---|", "| grpo | 0.5 ± 0.01 | 3 |", "| oar-g | 0.61 |  |"]
    assert results_markdown([{"m": "x", "v": 1}]).splitlines()[2] == "| x | 1 |"
    assert results_markdown({"acc": 0.5}).splitlines()[2] == "| acc | 0.5 |"
    assert results_markdown([1, 2]).startswith("```json")


def test_write_report(runs_root, tmp_path):
    (runs_root / "results.json").write_text(json.dumps({"oar-g": {"accuracy": 0.7}, "grpo": {"accuracy": 0.55}}))
    path = write_report([runs_root], tmp_path / "rep")
    md = path.read_text()
    plots = sorted(p.name for p in (tmp_path / "rep" / "plots").iterdir())
    assert plots == ["entropy.png", "eval_accuracy.png", "oar_ess_ratio.png", "reward.png", "step_time.png"]
    for name in plots:
        assert f"](plots/{name})" in md
        assert (tmp_path / "rep" / "plots" / name).read_bytes().startswith(PNG)
    lines = md.splitlines()
    grpo = next(line for line in lines if line.startswith("| grpo | 2 | 0, 1 |"))
    assert "0.55 ± 0.071 (0.5..0.6)" in grpo  # final eval/accuracy over the two seeds
    assert "0.25 ± 0 (0.25..0.25)" in grpo  # mean step time
    oar = next(line for line in lines if line.startswith("| oar-g | 3 | 0, 1, 2 |"))
    assert "0.7 ± 0.1 (0.6..0.8)" in oar and "0.8 ± 0 (0.8..0.8)" in oar
    assert "| oar-g | 0.7 |" in lines and "| grpo | 0.55 |" in lines  # results.json next to the runs
    # an explicit results object wins; one line per run
    md = write_report([runs_root / "grpo-0", runs_root / "grpo-1"], tmp_path / "rep2", results={"acc": 0.1},
                      group_by="run").read_text()
    assert "| acc | 0.1 |" in md and "| grpo-0 | 1 | 0 |" in md and "oar_ess_ratio" not in md


def test_step_time_breakdown_splits_by_importance_share(runs_root, tmp_path):
    make_run(tmp_path, "oar-p-0", "oar-p", 0, 0.6, extra={"step_time": 2.0, "oar/importance_share": 0.25})
    runs = [load_run(d) for d in [*expand_run_dirs([runs_root]), tmp_path / "oar-p-0"]]
    parts = step_time_breakdown(runs)
    assert parts["oar-p"] == pytest.approx((0.5, 1.5))  # 2 s per step, a quarter of it scoring
    assert parts["grpo"] == pytest.approx((0.0, 0.25)) and parts["oar-g"] == pytest.approx((0.0, 0.5))  # derived


def test_report_puts_the_results_table_and_key_figures_first(runs_root, tmp_path):
    table = "| credit | held-out acc |\n|---|---|\n| grpo | 55.0 |\n"
    (runs_root / "results.md").write_text(table)  # preferred to results.json, as oar compare writes both
    (runs_root / "results.json").write_text(json.dumps({"grpo": {"accuracy": 0.1}}))
    md = write_report([runs_root], tmp_path / "rep").read_text()
    heads = [line for line in md.splitlines() if line.startswith("## ")]
    assert heads == ["## Results", "## Key figures", "## Summary", "## All metrics", "## Runs"]
    assert table.strip() in md and "| grpo | 0.1 |" not in md
    figures = ["accuracy_vs_updates.png", "accuracy_vs_wall_clock.png", "step_time_breakdown.png", "weight_ess.png"]
    assert sorted(p.name for p in (tmp_path / "rep" / "figures").iterdir()) == sorted(figures)
    positions = [md.index(f"](figures/{name})") for name in figures]
    assert positions == sorted(positions) and positions[-1] < md.index("## All metrics")
    for name in figures:
        assert (tmp_path / "rep" / "figures" / name).read_bytes().startswith(PNG)
    # compare hands its table over directly; runs without OAR weights get no ESS figure
    md = write_report([runs_root / "grpo-0"], tmp_path / "rep2", results_md="| given |\n").read_text()
    assert "| given |" in md and "weight_ess.png" not in md and "step_time_breakdown.png" in md
