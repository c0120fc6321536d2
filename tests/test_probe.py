"""OutcomeProbe: the reasoning/answer split, the probe layout, flags and the map back to completions."""

from __future__ import annotations

import pytest
import torch

from oar import OutcomeProbe, ProbeBatch, rollout_tensors
from oar.importance import line_segments
from oar.probe import DEFAULT_CONCLUDE


def rollout(tok, prompts, completions, pad_id=None):
    """TRL's layout: left-padded prompts, right-padded completions, masks for both."""
    pad = tok.pad_token_id if pad_id is None else pad_id
    p = [tok(x, add_special_tokens=False)["input_ids"] for x in prompts]
    c = [tok(x, add_special_tokens=False)["input_ids"] for x in completions]
    return rollout_tensors(p, c, pad)


def text(tok, ids, mask=None):
    return tok.decode(ids if mask is None else ids[mask.bool()])


def test_probe_layout_and_split(char_tokenizer):
    tok = char_tokenizer
    prompts = ["Q: 3+4?", "Q: twelve times three, please?"]
    completions = ["3+4=7, so\n\\boxed{7}<eos>", "12*3=36\nThe answer is \\boxed{36}."]
    pb = OutcomeProbe(tok)(*rollout(tok, prompts, completions))
    assert isinstance(pb, ProbeBatch)
    assert pb.valid.tolist() == [True, True]
    for b, (reasoning, answer) in enumerate([("3+4=7, so\n", "7"), ("12*3=36\nThe answer is ", "36")]):
        full = prompts[b] + reasoning + DEFAULT_CONCLUDE + answer + "}"
        assert text(tok, pb.input_ids[b], pb.attention_mask[b]) == full
        assert text(tok, pb.input_ids[b], pb.reasoning_mask[b]) == reasoning
        assert text(tok, pb.input_ids[b], pb.answer_mask[b]) == answer
        n = len(full)
        assert pb.attention_mask[b, :n].all() and not pb.attention_mask[b, n:].any()  # right-padded
    assert pb.input_ids.dtype == torch.long and pb.reasoning_mask.dtype == torch.bool


def test_reasoning_tokens_are_the_completions_own_ids(char_tokenizer):
    tok = char_tokenizer
    args = rollout(tok, ["Q"], ["ab  c\n\\boxed{x}"])
    pb = OutcomeProbe(tok)(*args)
    completion_ids = args[2]
    rows, cols = pb.reasoning_mask.nonzero(as_tuple=True)
    assert torch.equal(pb.input_ids[rows, cols], completion_ids[rows, pb.completion_index[rows, cols]])
    assert torch.equal(pb.completion_index[pb.reasoning_mask], torch.arange(6))
    assert (pb.completion_index[~pb.reasoning_mask] == -1).all()
    assert pb.completion_reasoning_mask[0].tolist() == [True] * 6 + [False] * 9
    assert pb.completion_statement_mask[0].tolist() == [False] * 6 + [True] * 9


def test_to_completion_maps_scores_back(char_tokenizer):
    tok = char_tokenizer
    args = rollout(tok, ["Q", "Longer prompt"], ["abc\\boxed{1}", "x=1\ny=2\nThe answer is 3"])
    pb = OutcomeProbe(tok)(*args)
    scores = torch.arange(pb.input_ids.numel(), dtype=torch.float32).reshape(pb.input_ids.shape)
    out = pb.to_completion(scores, fill=-1.0)
    assert out.shape == args[2].shape
    assert torch.equal(out[pb.completion_reasoning_mask], scores[pb.reasoning_mask])
    assert (out[~pb.completion_reasoning_mask] == -1).all()
    assert text(tok, args[2][1], pb.completion_reasoning_mask[1]) == "x=1\ny=2\n"
    with pytest.raises(ValueError, match="shape"):
        pb.to_completion(scores[:, :-1])


def test_no_answer_and_too_short_are_flagged(char_tokenizer):
    tok = char_tokenizer
    completions = ["I am not sure.", "\\boxed{5}", "a\\boxed{5}", "ok so\n\\boxed{}"]
    pb = OutcomeProbe(tok)(*rollout(tok, ["Q"] * 4, completions))
    assert pb.no_answer.tolist() == [True, False, False, True]
    assert pb.too_short.tolist() == [False, True, True, False]
    assert not pb.valid.any()
    assert not pb.reasoning_mask.any() and not pb.answer_mask.any()
    assert not pb.completion_reasoning_mask.any() and not pb.completion_statement_mask.any()
    assert (pb.attention_mask.sum(dim=1) >= 1).all()  # an invalid row still runs through a model


def test_several_boxes_last_one_wins(char_tokenizer):
    tok = char_tokenizer
    completion = "try \\boxed{3}? no:\n\\boxed{\\frac{1}{2}} done"
    pb = OutcomeProbe(tok)(*rollout(tok, ["Q"], [completion]))
    assert text(tok, pb.input_ids[0], pb.reasoning_mask[0]) == "try \\boxed{3}? no:\n"
    assert text(tok, pb.input_ids[0], pb.answer_mask[0]) == "\\frac{1}{2}"


def test_answer_at_the_very_end_and_phrase_fallback(char_tokenizer):
    tok = char_tokenizer
    completions = ["2+2=4\n\\boxed{4}", "6/2=3\nThe answer is 3."]
    pb = OutcomeProbe(tok)(*rollout(tok, ["Q", "Q"], completions))
    assert pb.valid.all()
    assert [text(tok, pb.input_ids[b], pb.answer_mask[b]) for b in range(2)] == ["4", "3"]
    assert text(tok, pb.input_ids[1], pb.reasoning_mask[1]) == "6/2=3\n"


def test_truncated_completion_without_closing_brace(char_tokenizer):
    tok = char_tokenizer
    completions = ["so it is \\boxed{12", "2+3=5, the answer is 5\nso \\boxed{5"]
    pb = OutcomeProbe(tok)(*rollout(tok, ["Q", "Q"], completions))
    assert pb.no_answer.tolist() == [True, False]  # the second falls back to the answer phrase
    assert text(tok, pb.input_ids[1], pb.answer_mask[1]) == "5"
    assert text(tok, pb.input_ids[1], pb.reasoning_mask[1]) == "2+3=5, "


def test_pad_id_equal_to_eos_id(char_tokenizer):
    """SmolLM2-style: pad == eos; the completion mask, not the ids, decides what is padding."""
    tok = char_tokenizer
    eos = tok.eos_token_id
    prompt_ids = torch.tensor([[eos, eos] + tok("Hi", add_special_tokens=False)["input_ids"]])
    prompt_mask = torch.tensor([[0, 0, 1, 1]])
    body = tok("x=1\n\\boxed{1}", add_special_tokens=False)["input_ids"] + [eos]
    completion_ids = torch.tensor([body + [eos, eos]])
    completion_mask = torch.tensor([[1] * len(body) + [0, 0]])
    pb = OutcomeProbe(tok, pad_id=eos)(prompt_ids, prompt_mask, completion_ids, completion_mask)
    assert pb.valid.all()
    assert text(tok, pb.input_ids[0], pb.attention_mask[0]) == "Hix=1\n" + DEFAULT_CONCLUDE + "1}"
    assert pb.completion_statement_mask[0].tolist() == [False] * 4 + [True] * 10 + [False] * 2
    assert (pb.input_ids[0][~pb.attention_mask[0].bool()] == eos).all()


def test_max_length_truncates_the_prompt_from_the_left(char_tokenizer):
    tok = char_tokenizer
    prompt, completion = "ABCDEFGHIJ", "r1r2r3\n\\boxed{9}"
    tail = len(DEFAULT_CONCLUDE) + 2
    probe = OutcomeProbe(tok, max_length=4 + 7 + tail)
    pb = probe(*rollout(tok, [prompt, "AB"], [completion, completion]))
    assert pb.truncated.tolist() == [True, False] and pb.valid.all()
    assert text(tok, pb.input_ids[0], pb.attention_mask[0]).startswith("GHIJr1r2r3\n")
    assert text(tok, pb.input_ids[0], pb.reasoning_mask[0]) == "r1r2r3\n"
    short = OutcomeProbe(tok, max_length=5 + tail)(*rollout(tok, [prompt], [completion]))
    assert short.too_long.tolist() == [True] and not short.valid.any() and short.truncated.all()


def test_reference_answer_source(char_tokenizer):
    tok = char_tokenizer
    args = rollout(tok, ["Q", "Q"], ["a+b=3\n\\boxed{3}", "no idea"])
    pb = OutcomeProbe(tok, answer_source="reference")(*args, references=[" 42 ", "7"])
    assert text(tok, pb.input_ids[0], pb.answer_mask[0]) == "42"
    assert pb.valid.tolist() == [True, False] and pb.no_answer.tolist() == [False, True]
    with pytest.raises(ValueError, match="reference"):
        OutcomeProbe(tok, answer_source="reference")(*args)


def test_custom_markers_and_conclude(char_tokenizer):
    tok = char_tokenizer
    probe = OutcomeProbe(tok, conclude=" => ", box_markers=("\\fbox{",), phrases=())
    pb = probe(*rollout(tok, ["Q", "Q"], ["xy \\fbox{5}", "xy \\boxed{5}"]))
    assert pb.valid.tolist() == [True, False]
    assert text(tok, pb.input_ids[0], pb.attention_mask[0]) == "Qxy  => 5}"


def test_input_validation(char_tokenizer):
    tok = char_tokenizer
    p_ids, p_mask, c_ids, c_mask = rollout(tok, ["Q"], ["ab\\boxed{1}"])
    with pytest.raises(ValueError, match="answer_source"):
        OutcomeProbe(tok, answer_source="gold")
    with pytest.raises(ValueError, match="right-padded"):
        OutcomeProbe(tok)(p_ids, p_mask, c_ids, torch.cat([torch.zeros(1, 1, dtype=torch.long), c_mask[:, 1:]], 1))
    with pytest.raises(ValueError, match="shapes"):
        OutcomeProbe(tok)(p_ids, p_mask, c_ids, c_mask[:, :-1])


def test_line_segments(char_tokenizer):
    tok = char_tokenizer
    probe = OutcomeProbe(tok)
    pb = probe(*rollout(tok, ["Q"], ["ab\ncd\ne\\boxed{1}"]))
    seg = line_segments(pb.input_ids, pb.reasoning_mask, tok)
    assert seg[0][pb.reasoning_mask[0]].tolist() == [0, 0, 0, 1, 1, 1, 2]
    assert (seg[~pb.reasoning_mask] == -1).all()


def test_rollout_tensors_layout():
    p_ids, p_mask, c_ids, c_mask = rollout_tensors([[5, 6], [7]], [[8], [9, 10, 11]], pad_id=3)
    assert p_ids.tolist() == [[5, 6], [3, 7]] and p_mask.tolist() == [[1, 1], [0, 1]]  # prompts left-padded
    assert c_ids.tolist() == [[8, 3, 3], [9, 10, 11]] and c_mask.tolist() == [[1, 0, 0], [1, 1, 1]]  # right-padded
    assert c_mask.dtype == torch.long
    _, _, empty_ids, empty_mask = rollout_tensors([[5]], [[]])
    assert empty_ids.shape == (1, 1) and empty_mask.tolist() == [[0]]
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        rollout_tensors([[5], [6]], [[7]])
