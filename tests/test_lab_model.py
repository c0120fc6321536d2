"""Lab model, tokenizer, sampler and the cached warm start."""

from __future__ import annotations

import json

import torch

from oar.lab.model import ModelConfig, accuracy, build_model, lab_tokenizer, sample
from oar.lab.task import TaskConfig, make_split
from oar.lab.warmstart import WarmStartConfig, sft_batch, warm_start

TINY = WarmStartConfig(task=TaskConfig(verbosity=1, slip_rate=0.1), model=ModelConfig(hidden=32, layers=1, mlp=64),
                       steps=30, batch_size=16, warmup=5, lr=1e-2)


def test_tokenizer_encodes_lab_text_and_probe_text_one_char_per_token():
    tok = lab_tokenizer()
    p = make_split(TaskConfig(verbosity=2), "train", 1)[0]
    for text in (p.prompt, p.completion, "\n\nTherefore, the final answer is \\boxed{"):
        ids = tok(text)["input_ids"]
        assert len(ids) == len(text) and tok.pad_token_id not in ids
        assert tok.decode(ids) == text


def test_sft_batch_masks_prompt_and_pads():
    tok = lab_tokenizer()
    ps = make_split(TaskConfig(), "train", 3)
    ids, mask, labels = sft_batch(tok, ps)
    for i, p in enumerate(ps):
        n_p, n_c = len(p.prompt), len(p.completion) + 1
        assert (labels[i, :n_p] == -100).all()
        assert labels[i, n_p + n_c - 1] == tok.eos_token_id
        assert tok.decode(labels[i, n_p : n_p + n_c - 1].tolist()) == p.completion
        assert mask[i].sum() == n_p + n_c


def test_sampler_matches_full_forward_greedy():
    """The KV-cached sampler (left padding, explicit positions) equals argmax of uncached forwards."""
    tok = lab_tokenizer()
    model = build_model(ModelConfig(hidden=32, layers=2, mlp=64), len(tok), seed=1).eval()
    prompts = ["12+3=", "7-1+20="]
    out = sample(model, tok, prompts, temperature=0.0, max_new_tokens=6)
    for prompt, text in zip(prompts, out, strict=True):
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        for _ in range(6):
            nxt = model(input_ids=ids).logits[0, -1].argmax()
            if nxt == tok.eos_token_id:
                break
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
        assert tok.decode(ids[0, len(prompt):].tolist(), skip_special_tokens=True) == text


def test_warm_start_learns_and_is_cached(tmp_path):
    model, tok, path = warm_start(TINY, cache_dir=tmp_path, progress=False)
    info = json.loads((path / "info.json").read_text())
    assert path.name == TINY.key() and info["losses"][0] > 1.3 * info["loss"]
    again, _, path2 = warm_start(TINY, cache_dir=tmp_path, progress=False)  # loaded, not retrained
    assert path2 == path
    for a, b in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)
    assert WarmStartConfig(steps=31).key() != WarmStartConfig().key()
    r = accuracy(model, tok, make_split(TINY.task, "test", 8), k=2, max_new_tokens=8)
    assert set(r) == {"accuracy", "pass_at_k", "greedy_accuracy", "mean_length"}
    assert 0.0 <= r["accuracy"] <= r["pass_at_k"] <= 1.0 and r["mean_length"] <= 8
