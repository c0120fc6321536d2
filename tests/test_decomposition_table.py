"""The decomposition study's table (docs/studies/decomposition/table.py): the grid, both views and the verdicts."""

import importlib.util
import json
from pathlib import Path

import pytest

from oar.lab.compare import run_name

ROOT = Path(__file__).resolve().parents[1]


def _table():
    spec = importlib.util.spec_from_file_location("decomposition_table", ROOT / "docs/studies/decomposition/table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(runs: Path, column: str, w: int, seed: int, accs: list[float], seconds_per_eval: float) -> None:
    """A finished run: evaluations every 10 updates, ``seconds_per_eval`` training seconds apart."""
    path = runs / run_name(column, w, seed)
    path.mkdir(parents=True)
    rows = [{"step": 10 * i, "wall_time": seconds_per_eval * i, "eval/accuracy": a, "eval/greedy_accuracy": a,
             "eval/pass_at_k": a, **({"step_time": 1.0} if i else {})} for i, a in enumerate(accs)]
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (path / "summary.json").write_text("{}")


def _units(runs: Path, curves: dict) -> None:
    """Every column at the 2 × 2 units (w, s): ``curves[column](j)`` gives its accuracies and seconds per evaluation
    for the unit's jitter ``j`` = 0.01 (2w + s)."""
    for w in range(2):
        for s in range(2):
            for column, curve in curves.items():
                _run(runs, column, w, s, *curve(0.01 * (2 * w + s)))


def test_grid_views_and_verdicts(tmp_path):
    t = _table()
    _units(tmp_path, {
        "grpo": lambda j: ([0.2, 0.25, 0.3 + j], 5.0),
        "oracle-oar@rule=sign": lambda j: ([0.2, 0.4, 0.6 + j], 5.0),
        "oracle-oar@rule=bilevel": lambda j: ([0.2, 0.25, 0.3 - j], 5.0),
        # twice GRPO's cost: at GRPO's 10 seconds it has made half its updates (accuracy 0.35)
        "oar-g@rule=sign": lambda j: ([0.2, 0.35, 0.45 + j], 10.0),
    })
    _run(tmp_path, "oar-g@rule=step", 0, 0, [0.2, 0.2, 0.2], 5.0)  # an unfinished column: 1 of 4 units
    (tmp_path / run_name("oar-g@rule=step", 0, 1)).mkdir()  # a run that never finished is left out
    dirs = t.finished_runs(tmp_path, warm_seeds=2, seeds=2)
    assert ("oar-g@rule=step", "w0-s0") in dirs and ("oar-g@rule=step", "w0-s1") not in dirs
    d = t.decompose(dirs)
    rows = d["rows"]
    assert d["best_perfect"] == "oracle-oar@rule=sign"
    assert rows["oracle-oar@rule=sign"]["equal_updates"]["mean"] == pytest.approx(0.3)
    assert rows["oar-g@rule=sign"]["equal_updates"]["mean"] == pytest.approx(0.15)
    assert rows["oar-g@rule=sign"]["equal_seconds"]["mean"] == pytest.approx(0.35 - (0.3 + 0.015))
    assert rows["oar-g@rule=sign"]["efficiency_updates"]["mean"] == pytest.approx(0.5)
    assert rows["oar-g@rule=sign"]["cost_vs_grpo"] == pytest.approx(2.0)
    assert d["verdicts"]["perfect@sign"] == "turns perfect importance into gain"
    assert d["verdicts"]["perfect@bilevel"] == "no gain shown" and d["verdicts"]["perfect@process"] is None
    assert d["verdicts"]["OAR-G@sign"] == "keeps a share"
    text = t.markdown(d, units=4)
    assert "| perfect | -3.0 [" in text  # bilevel: 0.3 - j against GRPO's 0.3 + j, j = 0.015 on average
    assert "(1/4 units)" in text and "not run" in text
    t.plot(d, tmp_path / "decomposition.png")
    assert (tmp_path / "decomposition.png").stat().st_size > 1000
    assert d["best_practical"] == ["oar-g@rule=sign", "oar-g@rule=step"]  # ranked by mean Δ at equal updates
    assert d["vs_control"] == {}  # no shuffle: column, no control row


def test_confirmation_columns_and_shuffle_control(tmp_path):
    t = _table()
    _units(tmp_path, {
        "grpo": lambda j: ([0.2, 0.25, 0.3 + j], 5.0),
        "oracle-process": lambda j: ([0.2, 0.4, 0.6 + j], 5.0),
        "oar-prefix@rule=sign": lambda j: ([0.2, 0.3, 0.5 + j], 5.0),
        "shuffle:oar-prefix@rule=sign": lambda j: ([0.2, 0.3, 0.4 + j, 0.1], 5.0),  # one more update
        "random": lambda j: ([0.2, 0.2, 0.2], 5.0),  # not a confirmation column: left out
    })
    cols = ["oracle-process", "oar-prefix@rule=sign", "shuffle:oar-prefix@rule=sign"]
    dirs = t.finished_runs(tmp_path, warm_seeds=2, seeds=2, columns=cols)
    assert {c for c, _ in dirs} == {"grpo", *cols}
    d = t.decompose(dirs)
    v = d["vs_control"]["oar-prefix@rule=sign"]
    assert v["control"] == "shuffle:oar-prefix@rule=sign" and v["updates"] == 20  # the fewer updates of the two
    # the same jitter in both columns: s.d. 0.0129 each, Welch t (df 6) x 0.0091 = 0.022
    assert v["mean"] == pytest.approx(0.1) and v["ci95"] == pytest.approx(0.0223, abs=1e-3)
    assert "| `oar-prefix@rule=sign` | `shuffle:oar-prefix@rule=sign` | 20 | +10.0 [±2.2] |" in t.markdown(d, units=4)


def test_bilevel_cells_read_from_default_names(tmp_path):
    """The LM lab's Bi-Level cells are the credits' default-name runs (``oar-g-s0``): read as the grid's
    ``…@rule=bilevel`` columns with ``bilevel_default``, and not without it; their shuffle controls too."""
    t = _table()
    _units(tmp_path, {
        "grpo": lambda j: ([0.2, 0.25, 0.3 + j], 5.0),
        "oar-g": lambda j: ([0.2, 0.3, 0.4 + j], 5.0),
        "shuffle:oar-g": lambda j: ([0.2, 0.3, 0.35 + j], 5.0),
        "oar-g@rule=sign": lambda j: ([0.2, 0.25, 0.3 + j], 5.0),
    })
    plain = t.finished_runs(tmp_path, warm_seeds=2, seeds=2)
    assert not any(c == "oar-g@rule=bilevel" for c, _ in plain)
    dirs = t.finished_runs(tmp_path, warm_seeds=2, seeds=2, bilevel_default=True)
    assert dirs[("oar-g@rule=bilevel", "w1-s1")] == tmp_path / run_name("oar-g", 1, 1)
    assert {c for c, _ in dirs} == {"grpo", "oar-g@rule=bilevel", "oar-g@rule=sign", "shuffle:oar-g@rule=bilevel"}
    d = t.decompose(dirs)
    assert d["rows"]["oar-g@rule=bilevel"]["equal_updates"]["mean"] == pytest.approx(0.1)
    assert d["vs_control"]["oar-g@rule=bilevel"]["mean"] == pytest.approx(0.05)
    assert "| OAR-G | +10.0 [" in t.markdown(d, units=4)
