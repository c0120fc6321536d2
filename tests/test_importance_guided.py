"""G-guided OAR-P (``oar-pg``): exact OAR-P on OAR-G's top-k tokens, the rest calibrated onto OAR-P's scale."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import make_tiny_lm
from oar import gradient_scores, perturbation_scores
from oar.credit import CreditBatch, get_credit, token_credit
from oar.importance.guided import calibrate, guided_perturbation_scores, top_fraction
from oar.probe import OutcomeProbe, rollout_tensors
from test_importance_perturbation import assert_exact, inputs, probe_batch, sharpen


@pytest.fixture(scope="module")
def model(char_tokenizer):
    return sharpen(make_tiny_lm(len(char_tokenizer), "qwen2", seed=3))


@pytest.mark.parametrize("mode", ["last", "answer_joint"])
def test_k_one_is_exact_oar_p(char_tokenizer, model, mode):
    pb = probe_batch(char_tokenizer)
    exact = perturbation_scores(model, *inputs(pb), mode=mode)
    guided = guided_perturbation_scores(model, *inputs(pb), k=1.0, mode=mode,
                                        generator=torch.Generator().manual_seed(0))
    assert exact[pb.reasoning_mask].abs().median() > 1e-4
    torch.testing.assert_close(guided, exact, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("calibration", ["median", "below"])
def test_top_k_tokens_hold_exact_oar_p_and_the_rest_follow_oar_g(char_tokenizer, model, calibration):
    pb = probe_batch(char_tokenizer)
    r = pb.reasoning_mask
    k = 0.3
    guided = guided_perturbation_scores(model, *inputs(pb), k=k, calibration=calibration,
                                        generator=torch.Generator().manual_seed(0))
    guide = gradient_scores(model, *inputs(pb), mode="answer_mean", noise_std=1e-3,
                            generator=torch.Generator().manual_seed(0))
    exact_mask = top_fraction(guide, r, k)
    exact = perturbation_scores(model, *inputs(pb))
    assert (exact_mask.sum(1) == torch.ceil(r.sum(1) * k)).all()
    assert_exact(guided[exact_mask], exact[exact_mask])  # other chunks, other cached prefixes: float noise
    assert (guided[~r] == 0).all()
    rest = r & ~exact_mask
    assert not torch.equal(guided[rest], exact[rest]), "the rest is estimated, not perturbed"
    for b in range(r.shape[0]):  # within a row, the rest keeps OAR-G's order
        g, p = guide[b][rest[b]], guided[b][rest[b]]
        order = torch.argsort(g)
        assert (p[order].diff() >= 0).all()
        if calibration == "below":
            assert p.max() <= exact[b][exact_mask[b]].min()


def test_top_fraction_takes_the_ceiling_of_k_n_highest_per_row():
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.7, 0.0, 3.0], [5.0, 1.0, 2.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    got = top_fraction(scores, mask, 0.5)
    want = torch.tensor([[0, 1, 0, 1, 1, 0], [1, 0, 1, 0, 0, 0]], dtype=torch.bool)
    want[0, 4] = False  # ceil(0.5 * 5) = 3: 0.9, 0.7, 0.5; the unmasked 3.0 never counts
    want[0, 2] = True
    assert torch.equal(got, want)
    assert torch.equal(top_fraction(scores, mask, 1.0), mask)
    assert top_fraction(scores, mask, 1e-9).sum(1).tolist() == [1, 1]  # at least one token per row
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=f"k must be in \\(0, 1\\], got {bad}"):
            top_fraction(scores, mask, bad)


def test_median_calibration_recovers_a_proportional_relation_and_clamps_negative_slopes():
    g = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    exact_mask = torch.tensor([[1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    out = calibrate(g, 2.5 * g, exact_mask, mask, "median")
    torch.testing.assert_close(out, torch.tensor([[10.0, 7.5, 5.0, 2.5, 1.25, 0.0]]))
    # p / g = (2.25, 5/3): s = 5/3 (torch's median of an even count is the lower middle value), so one token
    # with a large p cannot inflate the rest
    out = calibrate(g, torch.tensor([[9.0, 5.0, 0, 0, 0, 0]]), exact_mask, mask, "median")
    torch.testing.assert_close(out[0, 2:5], torch.tensor([2.0, 1.0, 0.5]) * 5 / 3)
    out = calibrate(g, torch.tensor([[900.0, 5.0, 0, 0, 0, 0]]), exact_mask, mask, "median")
    torch.testing.assert_close(out[0, 2:5], torch.tensor([2.0, 1.0, 0.5]) * 5 / 3)
    negative = calibrate(g, torch.tensor([[-1.0, -2.0, 0, 0, 0, 0]]), exact_mask, mask, "median")
    assert (negative[0, 2:] == 0).all() and negative[0, 0] == -1.0  # exact values kept, no inverted rest


def test_below_calibration_places_the_rest_under_every_exact_token():
    g = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    exact_mask = torch.tensor([[1, 1, 0, 0]], dtype=torch.bool)
    out = calibrate(g, torch.tensor([[0.3, 6.0, 0, 0]]), exact_mask, mask, "below")
    # min exact p = 0.3 at the smallest exact g = 3: the rest is g * 0.1, below 0.3 and in OAR-G's order
    torch.testing.assert_close(out, torch.tensor([[0.3, 6.0, 0.2, 0.1]]))
    with pytest.raises(ValueError, match="unknown calibration 'iso'; valid: median, below"):
        calibrate(g, g, exact_mask, mask, "iso")


def test_fewer_perturbed_copies_than_exact_oar_p(char_tokenizer, model):
    """The point of the method: perturbed forwards cover about k of the reasoning tokens."""
    pb = probe_batch(char_tokenizer)
    copies = []

    def count(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        copies.append(0 if ids is None else ids.shape[0])

    hook = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        perturbation_scores(model, *inputs(pb), chunk_size=4)
        full = sum(copies)
        copies.clear()
        guided_perturbation_scores(model, *inputs(pb), k=0.25, chunk_size=4)
        part = sum(copies)
    finally:
        hook.remove()
    n = int(pb.reasoning_mask.sum())
    assert full >= n
    want = sum(math.ceil(0.25 * int(x)) for x in pb.reasoning_mask.sum(1))
    assert part < full / 2 and part >= want


def test_registered_credit_runs_through_token_credit(char_tokenizer, model):
    m = get_credit("oar-pg")
    assert (m.needs_policy, m.needs_probe, m.options["k"], m.options["calibration"]) == (True, True, 0.25, "median")
    pb_args = [char_tokenizer(x, add_special_tokens=False)["input_ids"] for x in ("Q1", "Q2")]
    comps = [char_tokenizer(x, add_special_tokens=False)["input_ids"] for x in ("a+b=c so 3\n\\boxed{3}",
                                                                              "5-2=3, 3*2=6\n\\boxed{6}")]
    batch = CreditBatch(*rollout_tensors(pb_args, comps), model=model)
    tc = token_credit("oar-pg", batch, probe=OutcomeProbe(char_tokenizer), options={"k": 0.5},
                      generator=torch.Generator().manual_seed(0))
    assert tc.mask.any(dim=1).all() and (tc.scores[tc.mask] >= 0).all()
    assert tc.weights[tc.mask].std() > 0
    with pytest.raises(ValueError, match=r"k must be in \(0, 1\], got 2"):
        token_credit("oar-pg", batch, probe=OutcomeProbe(char_tokenizer), options={"k": 2})
