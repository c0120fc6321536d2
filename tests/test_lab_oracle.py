"""The lab's oracle credits (oar.lab.oracle): weights on constructed completions with known slips."""

from __future__ import annotations

import pytest
import torch

import oar.lab  # noqa: F401  (registers the oracles)
from oar.credit import CreditBatch, credit_names, get_credit, token_credit
from oar.lab.model import lab_tokenizer
from oar.lab.task import BOXED, first_wrong_step, step_digit_positions
from oar.lab.tokenizer import decode_chars
from oar.probe import OutcomeProbe

PROMPT = "5+3-2+4="
RIGHT = "5+3=8; ok; 8-2=6; fine; 6+4=10; \\boxed{10}"
SLIP2 = "5+3=8; ok; 8-2=5; fine; 5+4=9; \\boxed{9}"  # second step wrong
SLIP1 = "5+3=9; ok; 9-2=7; fine; 7+4=11; \\boxed{11}"  # first step wrong: no correct prefix
BOXED_ONLY = "5+3=8; ok; 8-2=6; fine; 6+4=10; \\boxed{11}"  # every step right, wrong boxed value


def _batch(completions: list[str], advantages: list[float]) -> CreditBatch:
    tok = lab_tokenizer()
    p = tok([PROMPT] * len(completions), return_tensors="pt", padding=True)
    tok.padding_side = "right"
    c = tok([x + tok.eos_token for x in completions], return_tensors="pt", padding=True)
    return CreditBatch(p.input_ids, p.attention_mask, c.input_ids, c.attention_mask,
                       advantages=torch.tensor(advantages))


def test_oracles_are_registered_by_the_lab_with_zero_cost():
    for name in ("oracle-blame", "oracle-process", "oracle-oar"):
        assert name in credit_names()
        m = get_credit(name)
        assert not m.needs_policy and m.passes.startswith("0")
    assert get_credit("oracle-oar").needs_probe and not get_credit("oracle-blame").needs_probe


def test_decode_chars_keeps_one_character_per_token():
    tok = lab_tokenizer()
    ids = tok(SLIP2)["input_ids"] + [tok.eos_token_id, tok.pad_token_id]
    text = decode_chars(ids)
    assert text[: len(SLIP2)] == SLIP2 and len(text) == len(ids) and text[-2:] == "\x00\x00"


def test_blame_floors_the_correct_prefix_and_preserves_mass():
    b = _batch([RIGHT, SLIP2, SLIP1, BOXED_ONLY, SLIP2], [1.5, -0.5, -0.5, -0.5, 0.5])
    c = token_credit("oracle-blame", b)
    w, mask = c.weights, c.mask
    start = first_wrong_step(PROMPT, SLIP2)[0]
    assert start == SLIP2.index("8-2=5")
    n = int(mask[1].sum())
    assert torch.allclose(w[1, :start], torch.tensor(0.1))
    high = (n - 0.1 * start) / (n - start)
    assert torch.allclose(w[1, start:n], torch.full((n - start,), high))
    assert float((w[1] * mask[1]).sum() / mask[1].sum()) == pytest.approx(1.0)
    for r in (0, 2, 3, 4):  # success; slip at step 1 (no prefix); no wrong step; A > 0 with a slip
        assert torch.all(w[r] == 1.0), r
    assert torch.allclose(c.advantages(b.advantages)[1, :start], torch.tensor(-0.05))


def test_blame_floor_option_and_process_form():
    b = _batch([SLIP2], [-1.0])
    start, n = SLIP2.index("8-2=5"), int(b.completion_mask.sum())
    w0 = token_credit("oracle-blame", b, options={"floor": 0.0}).weights[0]
    assert torch.all(w0[:start] == 0) and w0[start:n].mean() == pytest.approx(n / (n - start))
    wp = token_credit("oracle-process", b).weights[0]
    assert torch.all(wp[:start] == 0) and torch.all(wp[start:n] == 1)  # mass not preserved
    with pytest.raises(ValueError, match="floor"):
        token_credit("oracle-blame", b, options={"floor": 2.0})


def test_blame_controls_move_the_mass():
    b = _batch([SLIP2], [-1.0])
    start, n = SLIP2.index("8-2=5"), int(b.completion_mask.sum())
    inv = token_credit("inverted:oracle-blame", b).weights[0]
    assert torch.allclose(inv[start:n], torch.tensor(0.1)) and inv[:n].mean() == pytest.approx(1.0)
    assert inv[0] == pytest.approx((n - 0.1 * (n - start)) / start)
    sh = token_credit("shuffle:oracle-blame", b, generator=torch.Generator().manual_seed(0)).weights[0, :n]
    orig = token_credit("oracle-blame", b).weights[0, :n]
    assert torch.equal(torch.sort(sh).values, torch.sort(orig).values) and not torch.equal(sh, orig)


def test_blame_needs_advantages():
    b = _batch([SLIP2], [-1.0])
    with pytest.raises(ValueError, match="advantages"):
        token_credit("oracle-blame", CreditBatch(b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask))


def test_oracle_oar_is_bilevel_of_the_step_digits():
    b = _batch([RIGHT, SLIP2], [1.0, -1.0])
    c = token_credit("oracle-oar", b, probe=OutcomeProbe(lab_tokenizer(), conclude=BOXED))
    for r, text in enumerate((RIGHT, SLIP2)):
        digits = set(step_digit_positions(text))
        reasoning = c.mask[r].nonzero().squeeze(1).tolist()
        assert reasoning == list(range(text.index("\\boxed")))  # the probe's reasoning span
        pivot = [i in digits for i in reasoning]
        s = c.scores[r, reasoning]
        assert s.tolist() == [float(p) for p in pivot]
        # binary scores, < 75% ones: theta = 0, pivotal 2, others 1, rescaled to mean 1 (OAR_SPEC section 4)
        p = sum(pivot) / len(pivot)
        w = c.weights[r, reasoning]
        assert torch.allclose(w[torch.tensor(pivot)], torch.tensor(2 / (1 + p)))
        assert torch.allclose(w[~torch.tensor(pivot)], torch.tensor(1 / (1 + p)))
    assert digits == {i for i, ch in enumerate(SLIP2[: SLIP2.index("\\boxed")]) if ch.isdigit()}
