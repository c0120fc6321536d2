"""Attribution records: JSONL round trip, cumulative token decoding, rank correlation, attribute()."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from oar.attribution import (
    AttributionRecord,
    append_records,
    attribute,
    attribute_batch,
    decode_tokens,
    is_record_file,
    rank_correlation,
    read_pairs,
    read_records,
    record_correlation,
)
from oar.reshape import bilevel_weights


def _record(credit="oar-g", scores=(0.1, 0.5, 2.0, 0.0), step=3) -> AttributionRecord:
    return AttributionRecord(
        tokens=["a", "\n", "b", "}"], scores=list(scores), weights=[0.5, 1.0, 2.0, 1.0],
        reasoning=[True, True, True, False], answer=[False, False, False, True], credit=credit,
        prompt="p?", advantage=0.5, reward=1.0, step=step,
    )


def test_records_round_trip_and_line_errors(tmp_path):
    path = tmp_path / "a.jsonl"
    recs = [_record(), _record("entropy", step=4)]
    append_records(path, recs[:1])
    append_records(path, recs[1:])
    assert read_records(path) == recs
    assert is_record_file(path)
    with open(path, "a") as f:
        f.write(json.dumps({"tokens": ["x"], "scores": [0.0]}) + "\n")
    with pytest.raises(ValueError, match=r"a\.jsonl:3: .*missing fields"):
        read_records(path)


def test_record_length_mismatch_is_rejected():
    with pytest.raises(ValueError, match="weights has 1 entries, tokens has 2"):
        AttributionRecord(["a", "b"], [0, 0], [1], [True, True], [False, False], "oar-g")


def test_pairs_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "1+1?", "completion": "2 \\\\boxed{2}"}\n\n{"prompt": "x", "completion": "y", '
                    '"reward": 1}\n')
    assert not is_record_file(path)
    assert read_pairs(path) == [("1+1?", "2 \\boxed{2}", None), ("x", "y", 1.0)]
    path.write_text('{"prompt": "x", "completion": "y", "reward": "1"}\n')
    with pytest.raises(ValueError, match="p.jsonl:1: 'reward' must be a number, got '1'"):
        read_pairs(path)
    path.write_text('{"prompt": "1+1?"}\n')
    with pytest.raises(ValueError, match="p.jsonl:1: expected string fields"):
        read_pairs(path)


def _byte_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    core.train_from_iterator(["the answer is 12 so 3+4=7 and then"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core)


def test_decode_tokens_reassembles_multibyte_characters():
    tok = _byte_bpe()
    text = "Café → 😀 costs 3€\n\n  so the answer is \\boxed{7}"
    ids = tok(text)["input_ids"]
    naive = "".join(tok.decode([i]) for i in ids)
    assert naive != text  # per-token decoding breaks the multi-byte characters
    pieces = decode_tokens(tok, ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == text
    assert "" in pieces  # a token holding the first bytes of a character
    assert "\n\n" in "".join(pieces) and "😀" in pieces
    cut = ids[: pieces.index("😀")]  # a completion cut off before the emoji's last byte
    assert tok.decode(cut).endswith("\ufffd") and "".join(decode_tokens(tok, cut)) == tok.decode(cut)


def test_decode_tokens_char_tokenizer(char_tokenizer):
    text = "12+3=15\n#15"
    ids = char_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert decode_tokens(char_tokenizer, ids) == list(text)
    assert decode_tokens(char_tokenizer, []) == []


def test_rank_correlation_matches_closed_form_without_ties():
    rng = random.Random(0)
    for n in (2, 5, 17):
        a = rng.sample(range(100), n)
        b = rng.sample(range(100), n)
        ra = {v: i for i, v in enumerate(sorted(a))}
        rb = {v: i for i, v in enumerate(sorted(b))}
        d2 = sum((ra[x] - rb[y]) ** 2 for x, y in zip(a, b, strict=True))
        assert rank_correlation(a, b) == pytest.approx(1 - 6 * d2 / (n * (n * n - 1)), abs=1e-12)


def test_rank_correlation_ties_monotone_and_degenerate():
    # average ranks: a -> [1, 2.5, 2.5, 4], b -> [1, 3, 2, 4]; Pearson of those by hand
    ra, rb = [1, 2.5, 2.5, 4], [1, 3, 2, 4]
    ma, mb = sum(ra) / 4, sum(rb) / 4
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    want = cov / math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    assert rank_correlation([1.0, 2.0, 2.0, 3.0], [1.0, 3.0, 2.0, 4.0]) == pytest.approx(want)
    x = torch.rand(50, generator=torch.Generator().manual_seed(1))
    assert rank_correlation(x, x.exp() * 3) == pytest.approx(1.0)
    assert rank_correlation(x, -x) == pytest.approx(-1.0)
    assert math.isnan(rank_correlation([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert math.isnan(rank_correlation([1.0], [2.0]))
    with pytest.raises(ValueError, match="equal lengths"):
        rank_correlation([1.0, 2.0], [1.0])


def test_record_correlation_compares_applied_weights_over_shared_reasoning_tokens():
    a = _record()  # weights 0.5, 1.0, 2.0 over the reasoning
    b = _record("entropy", scores=(9.0, 1.0, 5.0, 0.0))
    b.weights = [0.1, 0.2, 3.0, 7.0]  # the answer token's weight does not count
    assert record_correlation(a, b) == pytest.approx(1.0)
    b.scores = [1.0, 2.0, 3.0, 4.0]  # the raw scores do not count either
    assert record_correlation(a, b) == pytest.approx(1.0)
    b.reasoning = [False, True, True, False]
    b.weights = [9.0, 2.0, 1.0, 0.0]
    assert record_correlation(a, b) == pytest.approx(-1.0)


def test_record_correlation_of_additive_credit_uses_token_advantages():
    """KTAE-like (weight 1, offset added) against a multiplicative credit, at a negative advantage: the applied
    token advantages A*w + o, not the weights (which would give the opposite sign)."""
    mult = _record()
    mult.advantage = -2.0  # token advantages -1, -2, -4: ranks reversed from the weights
    add = _record("ktae")
    add.weights, add.offsets, add.advantage = [1.0] * 4, [0.0, 0.5, 1.0, 0.0], -2.0  # -2, -1.5, -1
    assert record_correlation(mult, add) == pytest.approx(-1.0)
    mult.advantage = add.advantage = 2.0  # 1, 2, 4 and 2, 2.5, 3
    assert record_correlation(mult, add) == pytest.approx(1.0)


def test_shuffle_control_is_not_reported_identical_to_its_method(char_tokenizer, tiny_qwen2):
    """The control keeps OAR-G's raw scores and permutes the weights: the viewer compares what each applies (the
    campaign's case read +1.000 from the scores)."""
    from oar.viz.style import correlations

    gen = torch.Generator().manual_seed(0)
    oar_g = attribute_batch(tiny_qwen2, char_tokenizer, PROMPTS[:1], COMPLETIONS[:1], "oar-g")[0]
    shuffled = attribute_batch(tiny_qwen2, char_tokenizer, PROMPTS[:1], COMPLETIONS[:1], "shuffle:oar-g",
                               generator=gen)[0]
    assert shuffled.scores == pytest.approx(oar_g.scores)  # the raw signal is the same
    assert sorted(shuffled.weights) == pytest.approx(sorted(oar_g.weights)) and shuffled.weights != oar_g.weights
    [(a, b, rho)] = correlations([oar_g, shuffled])
    assert (a, b) == ("oar-g", "shuffle:oar-g") and rho < 0.9
    assert rho == pytest.approx(rank_correlation([w for w, m in zip(oar_g.weights, oar_g.reasoning, strict=True) if m],
                                                 [w for w, m in zip(shuffled.weights, oar_g.reasoning, strict=True)
                                                  if m]))


PROMPTS = ["(2+3)*4?", "7-1?", "9+9?"]
COMPLETIONS = ["2+3=5;5*4=20\nso \\boxed{20}", "7-1=6, the answer is 6", "9+9 is eighteen"]


@pytest.mark.parametrize("credit", ["oar-g", "entropy"])
def test_attribute_batch_tiny_model(char_tokenizer, tiny_qwen2, credit):
    tiny_qwen2.train()
    recs = attribute_batch(tiny_qwen2, char_tokenizer, PROMPTS, COMPLETIONS, credit, batch_size=2)
    assert tiny_qwen2.training  # mode restored
    assert [r.text for r in recs] == COMPLETIONS
    assert [r.prompt for r in recs] == PROMPTS and all(r.credit == credit for r in recs)
    boxed, phrase, none = recs
    # boxed: reasoning is everything before "\boxed{", the statement is marked as answer
    start = COMPLETIONS[0].index("\\boxed{")
    assert boxed.reasoning == [i < start for i in range(len(boxed.tokens))]
    assert boxed.answer == [i >= start for i in range(len(boxed.tokens))]
    start = COMPLETIONS[1].index("the answer is")
    assert phrase.answer == [i >= start for i in range(len(phrase.tokens))]
    for r in (boxed, phrase):
        n = sum(r.reasoning)
        w = torch.tensor(r.weights)
        m = torch.tensor(r.reasoning)
        assert w[m].sum().item() == pytest.approx(n, rel=1e-5)  # mean weight 1 over the reasoning
        assert torch.all(w[~m] == 1) and all(s == 0 for s, k in zip(r.scores, r.reasoning, strict=True) if not k)
        assert w[m].std() > 0
        want = bilevel_weights(torch.tensor([r.scores]), m[None])[0]
        assert torch.allclose(w, want, atol=1e-6)
    # no final answer: nothing reshaped, nothing marked
    assert none.weights == [1.0] * len(none.tokens) and not any(none.reasoning) and not any(none.answer)


def test_attribute_single_equals_batched(char_tokenizer, tiny_qwen2):
    batched = attribute_batch(tiny_qwen2, char_tokenizer, PROMPTS[:2], COMPLETIONS[:2], "entropy")
    single = attribute(tiny_qwen2, char_tokenizer, PROMPTS[1], COMPLETIONS[1], "entropy")
    assert single.tokens == batched[1].tokens and single.reasoning == batched[1].reasoning
    assert single.scores == pytest.approx(batched[1].scores, rel=1e-4, abs=1e-6)


def test_attribute_rejects_bad_arguments(char_tokenizer, tiny_qwen2):
    with pytest.raises(ValueError, match="unknown credit 'nope'; registered: grpo, oar-g"):
        attribute(tiny_qwen2, char_tokenizer, "1?", "1 \\boxed{1}", "nope")
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        attribute_batch(tiny_qwen2, char_tokenizer, ["a", "b"], ["c"])


def test_attribute_group_methods_take_rewards_and_group_by_prompt(char_tokenizer, tiny_qwen2):
    prompts = ["2+2?"] * 4 + ["3+3?"] * 2
    completions = ["2+2=4 \\boxed{4}", "2+2=5 \\boxed{5}", "4 \\boxed{4}", "2+2=22 \\boxed{22}", "6 \\boxed{6}",
                   "3+3=6 \\boxed{6}"]
    recs = attribute_batch(tiny_qwen2, char_tokenizer, prompts, completions, "ktae", rewards=[1, 0, 1, 0, 1, 1])
    assert [r.reward for r in recs] == [1, 0, 1, 0, 1, 1] and all(r.offsets is not None for r in recs)
    assert [r.advantage > 0 for r in recs[:4]] == [True, False, True, False]  # the GRPO advantage the offsets join
    assert [r.advantage for r in recs[4:]] == [0.0, 0.0]
    # the "3+3?" group has one outcome only: no key tokens; the "2+2?" group has some
    assert all(o == 0 for r in recs[4:] for o in r.offsets)
    assert any(o != 0 for r in recs[:4] for o in r.offsets)
    with pytest.raises(ValueError, match="pass one reward per completion"):
        attribute_batch(tiny_qwen2, char_tokenizer, prompts, completions, "gtpo")
