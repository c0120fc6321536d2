"""Lab regimes: distractor labels, the first wrong step, regime presets, fidelity per kind and localisation."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from oar.lab.compare import PRESETS, base_config
from oar.lab.fidelity import attribution_fidelity, localisation
from oar.lab.model import ModelConfig, build_model, lab_tokenizer
from oar.lab.regimes import REGIMES, Regime, apply_regime
from oar.lab.task import (
    DISTRACTOR,
    PIVOTAL,
    TaskConfig,
    first_wrong_step,
    make_split,
    max_completion_chars,
    recorded_task,
)
from oar.lab.warmstart import WarmStartConfig


def test_distractors_hold_numbers_the_chain_never_uses():
    cfg = TaskConfig(distractors=2, max_steps=4)
    for p in make_split(cfg, "train", 40, seed=1):
        chain = {int(x) for x in re.findall(r"\d+", p.prompt)} | {int(x) for x in re.findall(r"=(\d+)", p.completion)}
        text = "".join(c if lab == DISTRACTOR else " " for c, lab in zip(p.completion, p.labels, strict=True))
        numbers = [int(x) for x in re.findall(r"\d+", text)]
        assert len(numbers) == 2 * len(re.findall(r"[+-]\d+", p.prompt))  # 2 per step
        assert not set(numbers) & chain, "a distractor restates a value of the chain"
        assert all(c.isdigit() for c, lab in zip(p.completion, p.labels, strict=True) if lab == PIVOTAL)
        assert len(p.completion) <= max_completion_chars(cfg)


def test_new_knobs_keep_the_old_keys():
    assert TaskConfig().key() == TaskConfig(distractors=0).key() != TaskConfig(distractors=1).key()
    assert "distractors" not in TaskConfig().key_fields()
    old = make_split(TaskConfig(), "test", 5)
    assert [p.completion for p in old] == [p.completion for p in make_split(TaskConfig(distractors=0), "test", 5)]
    with pytest.raises(ValueError, match="distractors must be >= 0"):
        TaskConfig(distractors=-1)


@pytest.mark.parametrize("completion, want", [
    ("25-8=17; ok; 17+5=22; \\boxed{22}", None),
    ("25-8=17; ok; 17+5=23; \\boxed{23}", (13, 20)),  # arithmetic slip in step 2
    ("25-8=18; ok; 18+5=23; \\boxed{23}", (0, 7)),  # step 1 wrong, step 2 right from the wrong value
    ("25-8=17; ok; 17+6=23; \\boxed{23}", (13, 20)),  # wrong operand
    ("25-8=17; ok; 16+5=21; \\boxed{21}", (13, 20)),  # copied the previous result wrong
    ("no steps \\boxed{3}", None),
])
def test_first_wrong_step(completion, want):
    assert first_wrong_step("25-8+5=", completion) == want


def test_regimes_apply_to_the_warm_start_task():
    assert set(REGIMES) >= {"default", "terse", "long", "distract", "verbose"}
    w = apply_regime(WarmStartConfig(), "long")
    assert (w.task.min_steps, w.task.max_steps, w.task.slip_rate) == (6, 8, WarmStartConfig().task.slip_rate)
    assert apply_regime(WarmStartConfig(), "default") == WarmStartConfig()
    with pytest.raises(ValueError, match="unknown regime 'longer'; regimes: default"):
        apply_regime(WarmStartConfig(), "longer")
    with pytest.raises(ValueError, match="unknown regime 'longer'; regimes: default"):
        base_config(PRESETS["default"], "longer")


def test_a_regime_names_a_misspelt_field_when_declared():
    """Every regime's task, recipe and protocol keys are fields of TaskConfig / RunConfig, checked when the regime
    is made (so at import for REGIMES), not when a comparison first applies it."""
    with pytest.raises(ValueError, match="regime recipe: 'learning_rate' is not a RunConfig field"):
        Regime(recipe={"learning_rate": 1e-4})
    with pytest.raises(ValueError, match="regime protocol: 'budget' is not a RunConfig field"):
        Regime(protocol={"budget": 100.0})
    with pytest.raises(ValueError, match="regime task: 'steps' is not a TaskConfig field"):
        Regime({"steps": 3})
    assert Regime({"verbosity": 0}, {"lr": 1e-4}, {"budget_s": 10.0}).recipe == {"lr": 1e-4}


SCAN_CELL = Path(__file__).parent.parent / "docs" / "studies" / "headroom" / "results" / "headroom_long_b16"


def test_the_headroom_regime_reproduces_the_confirmed_scan_cell():
    """``--regime long-b16`` builds exactly the runs the scan confirmed (the configuration its stored results
    recorded, so ``--resume`` keeps them), under the default and the study preset; ``--quick`` keeps its smoke budget
    and evaluation but trains the cell's recipe; an explicit budget still wins; a task-only regime leaves the recipe
    alone."""
    recorded = json.loads((SCAN_CELL / "results.json").read_text(encoding="utf-8"))["config"]
    cell = base_config(PRESETS["default"], "long-b16")
    built = json.loads(json.dumps(asdict(cell)))
    for config in (built, recorded):  # knobs added later, at their defaults, compare as absent
        config["warm"]["task"] = recorded_task(config["warm"]["task"])
    assert {k: built.get(k) for k in recorded if k not in ("credit", "seed")} == \
        {k: v for k, v in recorded.items() if k not in ("credit", "seed")}
    assert base_config(PRESETS["study"], "long-b16") == cell
    assert (cell.prompts_per_step, cell.group_size, cell.budget_s, cell.eval_every) == (4, 4, 100.0, 25)
    quick = base_config(PRESETS["quick"], "long-b16")
    assert (quick.prompts_per_step, quick.group_size, quick.lr) == (4, 4, 1e-4)
    assert (quick.budget_s, quick.eval_problems, quick.eval_every) == (30.0, 64, 10)
    assert quick.warm.task == cell.warm.task and quick.warm.steps != cell.warm.steps  # the smoke's short warm start
    assert base_config(PRESETS["default"], "long-b16", {"budget_s": 40.0}).budget_s == 40.0
    assert base_config(PRESETS["default"], "long-b16", {"lr": 2e-4}).lr == 2e-4
    long = base_config(PRESETS["default"], "long")
    assert long.warm == cell.warm and (long.prompts_per_step, long.budget_s) == (16, 240.0)


def test_fidelity_per_kind_and_localisation_run_on_a_tiny_model():
    tok = lab_tokenizer()
    model = build_model(ModelConfig(hidden=32, layers=1, mlp=64), len(tok), seed=0).eval()
    problems = make_split(TaskConfig(distractors=1, max_steps=2), "test", 12)
    res = attribution_fidelity(model, tok, problems, scorers=("random", "entropy"), batch_size=12)
    for r in res.values():
        assert 0.0 <= r["auc_distractor"] <= 1.0 and r["weight_distractor"] > 0


def test_localisation_counts_where_the_largest_weight_lands(monkeypatch):
    import torch

    import oar.lab.model
    from oar.credit import register_credit, unregister_credit

    tok = lab_tokenizer()
    model = build_model(ModelConfig(hidden=32, layers=1, mlp=64), len(tok), seed=0).eval()
    problems = make_split(TaskConfig(max_steps=2, min_steps=2), "test", 3)
    wrong = []  # each problem's solution with its last step's result off by one
    for p in problems:
        head, _, tail = p.completion.rpartition("=")
        value = int(re.match(r"\d+", tail).group())
        wrong.append(f"{head}={value + 1}{tail[len(str(value)):]}".replace(f"{{{value}}}", f"{{{value + 1}}}"))
    monkeypatch.setattr(oar.lab.model, "sample", lambda m, t, prompts, *a, **k: (wrong * 2)[: len(prompts)])
    spans = [first_wrong_step(p.prompt, w) for p, w in zip(problems, wrong, strict=True)]
    assert all(s is not None for s in spans)

    @register_credit("t-oracle", combine="multiply", needs_policy=False, needs_probe=False, passes="0",
                     paper="test", summary="weight 2 on the first wrong step",
                     effect=lambda scores, mask: 1 + scores)
    def oracle(batch):
        out = torch.zeros(batch.completion_ids.shape)
        for i, ids in enumerate(batch.completion_ids.tolist()):
            lo, hi = spans[wrong.index(tok.decode(ids, skip_special_tokens=True))]
            out[i, lo:hi] = 1.0
        return out

    register_credit("t-flat", combine="multiply", needs_policy=False, needs_probe=False, passes="0", paper="test",
                    summary="the same weight everywhere", effect=lambda scores, mask: 1 + scores)(
        lambda batch: torch.zeros(batch.completion_ids.shape))
    try:
        loc = localisation(model, tok, problems, scorers=("t-oracle", "random", "t-flat"), k=1)
    finally:
        unregister_credit("t-oracle")
        unregister_credit("t-flat")
    # equal weights everywhere: every token ties for the largest, so the rate is the chance rate, not 0 or 1
    assert loc["t-flat"]["rate"] == pytest.approx(loc["t-flat"]["chance"]) and 0 < loc["t-flat"]["rate"] < 1
    assert loc["t-oracle"]["completions"] == 3 and loc["t-oracle"]["rate"] == 1.0
    assert loc["t-oracle"]["weight_wrong_step"] > 1.0
    # chance: the wrong step's share of the tokens each method acts on (all tokens here, the reasoning for random)
    assert 0.0 < loc["t-oracle"]["chance"] < loc["random"]["chance"] < 0.6
