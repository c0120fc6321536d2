"""The headroom scan's table (oar.lab.headroom_scan): GRPO's curve, gaps at equal updates and at GRPO's seconds, the
declared flag and claim rules, from a cell's results.json."""

from __future__ import annotations

import json

import pytest

from oar.lab.headroom_scan import cell_rows, write_scan_table
from oar.lab.summary import summarize_comparison


def _run(tmp_path, credit, seed, accs, seconds_per_update):
    from oar.rundir import RunDir

    d = tmp_path / "runs" / f"{credit}-s{seed}"
    d.mkdir(parents=True)
    rows = [{"step": s, "wall_time": s * seconds_per_update, "eval/accuracy": a, "eval/greedy_accuracy": a,
             "eval/pass_at_k": a} for s, a in zip((0, 50, 100), accs, strict=True)]
    RunDir(d).metrics_jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


@pytest.fixture
def results(tmp_path):
    # GRPO drifts down 0.40 -> 0.50 -> 0.35; the process oracle climbs and is 1.5x as slow per update
    dirs = {}
    for seed, noise in enumerate((0.0, 0.02, -0.02)):
        dirs[("grpo", seed)] = _run(tmp_path, "grpo", seed, (0.40, 0.50 + noise, 0.35 + noise), 10.0)
        dirs[("oracle-process", seed)] = _run(tmp_path, "oracle-process", seed, (0.40, 0.55, 0.60 + noise), 15.0)
        dirs[("oracle-oar", seed)] = _run(tmp_path, "oracle-oar", seed, (0.40, 0.50, 0.36 + noise), 10.0)
    return summarize_comparison(dirs)


def test_cell_rows_read_grpos_curve_and_both_views(results):
    grpo, rows = cell_rows(results, horizon=100)
    assert grpo["start"] == pytest.approx(0.40) and grpo["peak"] == pytest.approx(0.50) and grpo["peak_step"] == 50
    assert grpo["end"] == pytest.approx(0.35) and grpo["drifts_below_start"]
    proc = next(r for r in rows if r["credit"] == "oracle-process")
    assert proc["matched_diff"]["mean"] == pytest.approx(0.25) and proc["matched_step"] == 100
    # at GRPO's 1,000 s the oracle has made 66.7 updates: 0.55 + (0.60 - 0.55) * 1/3 on average
    assert proc["seconds_diff"]["mean"] == pytest.approx(0.55 + 0.05 / 3 - 0.35, abs=1e-9)
    assert proc["s_per_update"]["mean"] == pytest.approx(15.0)


def test_scan_table_flags_and_claims_by_the_declared_rules(tmp_path, results):
    (tmp_path / "cell-a").mkdir()
    (tmp_path / "cell-a" / "results.json").write_text(json.dumps(results))
    scan = write_scan_table(tmp_path, ["cell-a", "cell-b"], claim_points=5.0, flag_points=5.0, horizon=100)
    v = scan["cells"]["cell-a"]["verdict"]
    assert v["best_oracle"] == "oracle-process" and v["flagged"] and v["headroom"]
    assert scan["best_cell"] == "cell-a" and "cell-b" not in scan["cells"]
    assert (tmp_path / "scan.png").stat().st_size > 0 and "oracle-process" in (tmp_path / "scan.md").read_text()
    strict = write_scan_table(tmp_path, ["cell-a"], claim_points=30.0, flag_points=30.0, horizon=100)
    assert not strict["cells"]["cell-a"]["verdict"]["flagged"] and not strict["cells"]["cell-a"]["verdict"]["headroom"]
