"""Baseline scorers and the scorer registry."""

from __future__ import annotations

import pytest
import torch

import oar
from helpers import make_tiny_lm
from oar import entropy_scores, random_scores, uniform_scores
from test_importance_perturbation import inputs, probe_batch


@pytest.fixture(scope="module")
def setup(char_tokenizer):
    return make_tiny_lm(len(char_tokenizer), "qwen2", seed=5), probe_batch(char_tokenizer)


def test_uniform_is_one_on_reasoning(setup):
    model, pb = setup
    s = uniform_scores(model, *inputs(pb))
    assert torch.equal(s, pb.reasoning_mask.float())
    weights = oar.bilevel_weights(pb.to_completion(s), pb.completion_reasoning_mask)
    assert (weights == 1).all()  # uniform scores reduce OAR to GRPO


def test_random_is_seeded_and_masked(setup):
    model, pb = setup
    a = random_scores(model, *inputs(pb), generator=torch.Generator().manual_seed(0))
    b = random_scores(model, *inputs(pb), generator=torch.Generator().manual_seed(0))
    c = random_scores(model, *inputs(pb), generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert (a[~pb.reasoning_mask] == 0).all() and (a[pb.reasoning_mask] > 0).all()


def test_entropy_matches_a_direct_computation(setup):
    model, pb = setup
    s = entropy_scores(model, *inputs(pb), batch_size=2)
    for b in range(pb.input_ids.shape[0]):
        keep = pb.attention_mask[b].bool()
        with torch.no_grad():
            p = torch.softmax(model(pb.input_ids[b][keep][None]).logits[0].float(), -1)
        h = -(p * p.log()).sum(-1)  # h[i]: entropy of the distribution that produced token i + 1
        expected = torch.zeros(int(keep.sum()))
        expected[1:] = h[:-1]
        expected *= pb.reasoning_mask[b][keep]
        torch.testing.assert_close(s[b][keep], expected, rtol=1e-4, atol=1e-5)
    assert (s[~pb.reasoning_mask] == 0).all() and (s[pb.reasoning_mask] > 0).all()


# the probe scorers: the credit registry's probe methods' scores (one registry), plus the uniform baseline
SCORERS = {"oar-p": oar.perturbation_scores, "oar-g": oar.gradient_scores, "uniform": uniform_scores,
           "random": random_scores, "entropy": entropy_scores}


def test_scorers_are_the_registered_probe_methods_scores(setup):
    model, pb = setup
    for name, scorer in SCORERS.items():
        if name != "uniform":
            assert oar.get_credit(name.upper()).score is scorer and oar.get_credit(name).needs_probe
        s = scorer(model, *inputs(pb))
        assert s.shape == pb.input_ids.shape and s.dtype == torch.float32
        assert (s[~pb.reasoning_mask] == 0).all() and (s[pb.reasoning_mask] > 0).any()
    assert not hasattr(oar, "get_scorer") and "SCORERS" not in oar.__all__  # no second registry


def test_every_scorer_handles_a_batch_without_answers(char_tokenizer):
    # a probe of rows with no answer is one pad token each: every scorer must return zeros, not crash
    model = make_tiny_lm(len(char_tokenizer), "qwen2", seed=5)
    prompt = char_tokenizer(["1+1?", "2+2?"], return_tensors="pt", padding=True)
    completion = char_tokenizer(["no answer here", "none"], return_tensors="pt", padding=True, padding_side="right")
    pb = oar.OutcomeProbe(char_tokenizer)(prompt.input_ids, prompt.attention_mask,
                                          completion.input_ids, completion.attention_mask)
    assert not pb.valid.any()
    for name, scorer in SCORERS.items():
        s = scorer(model, *inputs(pb))
        assert s.shape == pb.input_ids.shape and (s == 0).all(), name
