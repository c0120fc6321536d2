"""The prepared GPU check runs end to end at its tiny CPU shape (``--smoke``) and writes its JSON and Markdown."""

from __future__ import annotations

import json

import pytest
from checks import gpu_check


def test_gpu_check_smoke_writes_every_section(tmp_path):
    res = gpu_check.main(["--smoke", "--out", str(tmp_path / "check")])
    saved = json.loads((tmp_path / "check.json").read_text())
    assert saved["setup"]["smoke"] and saved["setup"]["shape"]["group"] == 4
    assert all(res["exactness"][k]["pass"] for k in ("oar-p", "oar-p horizon", "oar-g"))
    assert res["exactness"]["oar-p"]["naive_vs_fp32"]["scale"] > 0  # scores, not all zeros
    assert set(res["scorers"]) == {"oar-g", "oar-pg", "oar-p horizon", "oar-p"}
    assert all(r["seconds"] > 0 for r in res["scorers"].values())
    assert list(saved["steps"]) == list(gpu_check.CREDITS)
    for credit, r in saved["steps"].items():
        assert r["step_time"] > 0, credit
        if credit != "grpo":  # every completion was scored (the reward gives every row a non-zero advantage)
            assert r["frac_scored"] == 1.0 and r["importance_time"] > 0, credit
    g, sc = saved["goals"], saved["scorers"]
    assert set(g) == set(gpu_check.GOALS) and all(r["value"] > 0 and r["met"] in (True, False) for r in g.values())
    body = saved["setup"]["params"] - saved["setup"]["config"]["vocab_size"] * saved["setup"]["config"]["hidden_size"]
    tok = gpu_check.char_tokenizer(gpu_check.SMOKE["vocab_size"])
    rows = gpu_check.make_rows(tok, gpu_check.Shape(**saved["setup"]["shape"]))
    assert sc["oar-g"]["tokens"] == int(gpu_check.probes(tok, *rows, "cpu").attention_mask.sum())
    assert sc["oar-g"]["tflops"] == pytest.approx(4 * body * sc["oar-g"]["tokens"] / sc["oar-g"]["seconds"] / 1e12)
    assert g["oar-g share of peak"]["value"] == pytest.approx(sc["oar-g"]["tflops"] / 989.0)
    grpo = saved["steps"]["grpo"]["step_time"]
    assert g["oar-g share of grpo step"]["value"] == pytest.approx(sc["oar-g"]["seconds"] / grpo)
    ratio = sc["oar-p horizon"]["seconds"] / sc["oar-g"]["seconds"]
    assert g["oar-p horizon / oar-g"] == {"value": pytest.approx(ratio), "goal": 2.0, "met": ratio <= 2.0}
    md = (tmp_path / "check.md").read_text()
    assert "## Exactness in bf16" in md and "| oar-p |" in md and "| grpo | " in md
    assert "## Performance goals" in md and "| oar-g share of peak |" in md


def test_gpu_check_rejects_an_unknown_credit_before_building_anything(tmp_path):
    with pytest.raises(ValueError, match="unknown credit 'oar-x'"):
        gpu_check.main(["--smoke", "--credits", "grpo,oar-x", "--out", str(tmp_path / "check")])
    assert not (tmp_path / "check.json").exists()
