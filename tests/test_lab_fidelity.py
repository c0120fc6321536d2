"""Attribution fidelity: the AUC is exact, the lab batch is aligned with the labels, scorers run end to end."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oar.lab.fidelity import FIDELITY_SCORERS, attribution_fidelity, lab_batch, pairwise_auc
from oar.lab.model import ModelConfig, build_model, lab_tokenizer
from oar.lab.task import FILLER, PIVOTAL, TaskConfig, make_split


def _mann_whitney(pos: list[float], neg: list[float]) -> float:
    """Rank formula with average ranks for ties: U = R+ - n+(n+ + 1)/2."""
    allv = sorted(pos + neg)
    rank = {v: sum(i + 1 for i, w in enumerate(allv) if w == v) / allv.count(v) for v in allv}
    u = sum(rank[v] for v in pos) - len(pos) * (len(pos) + 1) / 2
    return u / (len(pos) * len(neg))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0, 1, 2])), min_size=2, max_size=12))
def test_pairwise_auc_matches_mann_whitney(cells):
    scores = torch.tensor([[float(s) for s, _ in cells]])
    pos = torch.tensor([[k == 1 for _, k in cells]])
    neg = torch.tensor([[k == 2 for _, k in cells]])
    auc = pairwise_auc(scores, pos, neg)[0].item()
    p = [float(s) for s, k in cells if k == 1]
    n = [float(s) for s, k in cells if k == 2]
    if p and n:
        assert abs(auc - _mann_whitney(p, n)) < 1e-6
    else:
        assert auc != auc  # NaN


def test_lab_batch_aligns_labels_with_tokens():
    tok = lab_tokenizer()
    problems = make_split(TaskConfig(verbosity=2), "test", 5)
    b = lab_batch(tok, problems)
    for i, p in enumerate(problems):
        n = len(p.completion)
        assert b["completion_mask"][i].sum() == n + 1 and b["completion_ids"][i, n] == tok.eos_token_id
        chars = tok.convert_ids_to_tokens(b["completion_ids"][i, :n].tolist())
        for c, lab in zip(chars, b["labels"][i, :n].tolist(), strict=True):
            assert (lab == PIVOTAL) == c.isdigit() or lab == 3
            if lab == FILLER:
                assert c.isalpha() or c == " "


def test_fidelity_runs_every_scorer_and_random_is_chance():
    tok = lab_tokenizer()
    model = build_model(ModelConfig(hidden=32, layers=1, mlp=64), len(tok), seed=0).eval()
    problems = make_split(TaskConfig(verbosity=2, max_steps=2), "test", 24)
    res = attribution_fidelity(model, tok, problems, batch_size=12)
    assert set(res) == set(FIDELITY_SCORERS)
    for r in res.values():
        assert r["completions"] == 24 and 0.0 <= r["auc_filler"] <= 1.0 and 0.0 <= r["auc_rest"] <= 1.0
    assert abs(res["random"]["auc_filler"] - 0.5) < 0.1
    # a control keeps its method's signal (the same AUC) but not where the weight goes
    pair = attribution_fidelity(model, tok, problems, scorers=("entropy", "shuffle:entropy"), batch_size=12)
    assert pair["shuffle:entropy"]["auc_filler"] == pair["entropy"]["auc_filler"]
    with pytest.raises(ValueError, match="rollout-group statistics"):
        attribution_fidelity(model, tok, problems, scorers=("ktae",))


def test_fidelity_reports_mean_weight_per_token_kind():
    tok = lab_tokenizer()
    model = build_model(ModelConfig(hidden=32, layers=1, mlp=64), len(tok), seed=0).eval()
    problems = make_split(TaskConfig(verbosity=2, max_steps=2), "test", 24)
    res = attribution_fidelity(model, tok, problems, scorers=("random", "oar-g"), batch_size=12)
    for r in res.values():
        w = [r[f"weight_{k}"] for k in ("pivotal", "structure", "filler")]
        assert all(0.0 < x < 3.0 for x in w), w
    # random scores give each kind of token about its uniform share of the advantage
    assert all(abs(res["random"][f"weight_{k}"] - 1.0) < 0.2 for k in ("pivotal", "structure", "filler"))


def test_token_steps_take_each_tokens_step_from_its_characters():
    from oar.lab.fidelity import token_steps
    from oar.lab.task import steps_from_end

    text = "3+4=7; 7-2=5; \\boxed{5}"
    chars = steps_from_end(text, len(text))
    per_char = [(j, j + 1) for j in range(len(text))]
    assert token_steps([per_char], [text], len(text) + 2)[0].tolist() == chars + [0, 0]  # eos and padding: 0
    assert chars[:5] == [2] * 5 and chars[7:12] == [1] * 5
    merged = [(0, 4), (4, 9), (9, len(text))]  # BPE-like pieces: "7; 7-" covers two steps and takes the farther
    assert token_steps([merged], [text], 4)[0].tolist() == [2, 2, 1, 0]  # then "=5; \\boxed{5}", padding


def test_weight_by_step_covers_every_step_and_rejects_group_methods():
    from oar.lab.fidelity import weight_by_step

    tok = lab_tokenizer()
    model = build_model(ModelConfig(hidden=32, layers=1, mlp=64), len(tok), seed=0).eval()
    problems = make_split(TaskConfig(min_steps=3, max_steps=3), "test", 16)
    out = weight_by_step(model, tok, problems, scorers=("random", "oar-g"), batch_size=8)
    assert set(out["random"]) == set(out["oar-g"]) == {1, 2, 3}
    assert all(abs(w - 1.0) < 0.25 for w in out["random"].values())  # random scores: about the uniform share
    assert all(0.3 < w < 3.0 for w in out["oar-g"].values())
    with pytest.raises(ValueError, match="rollout-group statistics"):
        weight_by_step(model, tok, problems, scorers=("ktae",))
