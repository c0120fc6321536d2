"""OAR-prefix (oar.importance.prefix): the batched, cached engine equals its plain definition; steps, boundaries."""

from __future__ import annotations

import pytest
import torch

from oar.credit import CreditBatch, token_credit
from oar.importance.prefix import prefix_scores, prefix_scores_naive, separator_ids, step_ids
from oar.probe import OutcomeProbe

PROMPTS = ["5+3-2+4=", "12-3+7=", "7+1="]
COMPLETIONS = ["5+3=8; ok; 8-2=6; fine; 6+4=10; \\boxed{10}", "12-3=9;\n9+7=16; \\boxed{16}",
               "7+1=8 \\boxed{8}"]  # the last has no separator: one step


def _probes(tok, prompt_side: str = "left", conclude: str = "\\boxed{"):
    tok.padding_side = prompt_side
    p = tok(PROMPTS, return_tensors="pt", padding=True)
    tok.padding_side = "right"
    c = tok([x + tok.eos_token for x in COMPLETIONS], return_tensors="pt", padding=True)
    return p, c, OutcomeProbe(tok, conclude=conclude)(p.input_ids, p.attention_mask, c.input_ids,
                                                          c.attention_mask)


@pytest.mark.parametrize("model_name", ["tiny_qwen2", "tiny_llama"])
@pytest.mark.parametrize("chunk_size", [1, 3, 64])
@pytest.mark.parametrize("side", ["left", "right"])
def test_fast_equals_naive(char_tokenizer, model_name, chunk_size, side, request):
    model = request.getfixturevalue(model_name)
    _, _, pb = _probes(char_tokenizer, side)
    ends = separator_ids(char_tokenizer, r"\n|;")
    args = (pb.input_ids, pb.attention_mask, pb.reasoning_mask, pb.answer_mask)
    fast = prefix_scores(model, *args, boundary_ids=ends, chunk_size=chunk_size)
    naive = prefix_scores_naive(model, *args, ends)
    assert fast.shape == pb.input_ids.shape and torch.all(fast[~pb.reasoning_mask] == 0)
    assert torch.allclose(fast, naive, atol=2e-6), (fast - naive).abs().max()
    assert (fast[pb.reasoning_mask] > 0).all()


def test_every_token_of_a_step_shares_its_score(char_tokenizer, tiny_qwen2):
    _, _, pb = _probes(char_tokenizer)
    ends = torch.tensor(separator_ids(char_tokenizer, r";"))
    s = prefix_scores(tiny_qwen2, pb.input_ids, pb.attention_mask, pb.reasoning_mask, pb.answer_mask,
                      boundary_ids=ends.tolist())
    steps = step_ids(pb.input_ids, pb.reasoning_mask, ends)
    for r in range(len(PROMPTS)):
        per_step = {}
        for t in pb.reasoning_mask[r].nonzero().squeeze(1).tolist():
            per_step.setdefault(int(steps[r, t]), set()).add(round(float(s[r, t]), 7))
        assert all(len(v) == 1 for v in per_step.values())
        text = COMPLETIONS[r][: COMPLETIONS[r].index("\\boxed")]
        assert len(per_step) == text.count(";") + (0 if text.endswith(";") else 1)
    assert len({float(x) for x in s[2][pb.reasoning_mask[2]]}) == 1  # no separator: one step


def test_separator_ids_and_errors(char_tokenizer, tiny_qwen2):
    semi, nl = char_tokenizer.convert_tokens_to_ids([";", "\n"])
    assert separator_ids(char_tokenizer, r"\n|;") == tuple(sorted((semi, nl)))
    with pytest.raises(ValueError, match="not a regular expression"):
        separator_ids(char_tokenizer, "(")
    with pytest.raises(ValueError, match="no token"):
        separator_ids(char_tokenizer, "§§")
    _, _, pb = _probes(char_tokenizer)
    with pytest.raises(ValueError, match="boundary_ids or a probe"):
        prefix_scores(tiny_qwen2, pb.input_ids, pb.attention_mask, pb.reasoning_mask, pb.answer_mask)
    with pytest.raises(ValueError, match="chunk_size"):
        prefix_scores(tiny_qwen2, pb.input_ids, pb.attention_mask, pb.reasoning_mask, pb.answer_mask,
                      boundary_ids=[semi], chunk_size=0)


def test_registered_credit_reads_the_probe_tokenizer(char_tokenizer, tiny_qwen2):
    p, c, pb = _probes(char_tokenizer)
    batch = CreditBatch(p.input_ids, p.attention_mask, c.input_ids, c.attention_mask, model=tiny_qwen2)
    credit = token_credit("oar-prefix", batch, probe=OutcomeProbe(char_tokenizer, conclude="\\boxed{"))
    direct = prefix_scores(tiny_qwen2, pb.input_ids, pb.attention_mask, pb.reasoning_mask, pb.answer_mask,
                           boundary_ids=separator_ids(char_tokenizer))
    assert torch.allclose(credit.scores, pb.to_completion(direct).masked_fill(~credit.mask, 0.0))
    w = credit.weights[credit.mask.any(dim=1)]
    assert torch.allclose((credit.weights * credit.mask).sum(1)[:2] / credit.mask.sum(1)[:2], torch.ones(2))
    assert w.shape[0] == 3
