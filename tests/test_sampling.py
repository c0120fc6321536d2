"""oar.sampling: the inverse-CDF draw, the KV-cached sampler, the rollout copy and its use in the trainer."""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset
from transformers import GenerationConfig

from helpers import make_tiny_lm
from oar.sampling import RolloutCopy, draw, plain_sampling, sample_tokens
from trainer_setup import exact_reward, grpo_kwargs, task_rows, warm_tiny_lm


def test_draw_samples_the_softmax_distribution():
    """Frequencies of 40,000 draws of each row are within 5 standard errors of softmax(logits / T)."""
    logits = torch.tensor([[2.0, 0.5, -1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 5.0]])
    n = 40_000
    gen = torch.Generator().manual_seed(0)
    for temperature in (1.0, 0.5, 2.0):
        counts = torch.zeros_like(logits)
        rows = logits.repeat(n, 1)
        toks = draw(rows, temperature, gen).view(n, 2)
        for r in range(2):
            counts[r] = torch.bincount(toks[:, r], minlength=5).float()
        p = torch.softmax(logits / temperature, dim=-1)
        se = (p * (1 - p) / n).sqrt()
        assert ((counts / n - p).abs() <= 5 * se + 1e-4).all(), (temperature, counts / n, p)


def test_draw_at_temperature_zero_is_argmax_and_never_out_of_vocab():
    logits = torch.randn(64, 11)
    assert torch.equal(draw(logits, 0.0), logits.argmax(-1))
    peaked = torch.full((8, 11), -1e4)
    peaked[:, -1] = 0.0  # all the mass on the last id: a rounding cumulative sum must not step past it
    assert (draw(peaked, 1.0) == 10).all()


def _left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def test_greedy_sampling_equals_transformers_generate_and_ignores_left_padding(char_tokenizer):
    model = warm_tiny_lm(char_tokenizer, steps=60)
    prompts = [char_tokenizer(r["prompt"])["input_ids"] for r in task_rows(6)]
    prompts[0] = char_tokenizer("12+3=")["input_ids"]  # a longer prompt: the others are left-padded
    ids, mask = _left_pad(prompts, char_tokenizer.pad_token_id)
    ours = sample_tokens(model, ids, mask, max_new_tokens=12, temperature=0.0, eos_token_ids=1, pad_token_id=0)
    hf = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12,
                        eos_token_id=1, pad_token_id=0)[:, ids.shape[1]:]
    assert torch.equal(ours, hf[:, : ours.shape[1]])
    for i, p in enumerate(prompts):  # each row alone, unpadded, gives the same tokens
        alone = sample_tokens(model, torch.tensor([p]), torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=12, temperature=0.0, eos_token_ids=1, pad_token_id=0)
        assert torch.equal(alone[0], ours[i, : alone.shape[1]])


def test_rows_end_at_their_first_eos_then_pad_and_sampling_stops_when_all_ended():
    model = make_tiny_lm(20)
    eos_after = {"n": 0}

    class Forced(torch.nn.Module):
        """The tiny LM with its logits overwritten: ids 5, 6, then eos for every row."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, **kw):
            out = self.inner(**kw)
            step = eos_after["n"]
            eos_after["n"] += 1
            logits = torch.full_like(out.logits, -1e4)
            logits[..., (5, 6, 1)[min(step, 2)]] = 0.0
            out.logits = logits
            return out

    ids = torch.tensor([[3, 4], [0, 4]])
    new = sample_tokens(Forced(model), ids, torch.tensor([[1, 1], [0, 1]]), max_new_tokens=10, temperature=1.0,
                        eos_token_ids=[1, 19], pad_token_id=0)
    assert new.tolist() == [[5, 6, 1], [5, 6, 1]]  # stopped after 3 tokens, not 10
    assert eos_after["n"] == 3


def test_plain_sampling_recognises_what_the_fast_path_implements():
    assert plain_sampling(GenerationConfig(do_sample=True, temperature=0.7, top_k=0, top_p=1.0))
    assert plain_sampling(GenerationConfig(do_sample=False))
    for change in ({"top_k": 5}, {"top_p": 0.9}, {"min_p": 0.1}, {"repetition_penalty": 1.2}):
        assert not plain_sampling(GenerationConfig(do_sample=True, **{"top_k": 0, "top_p": 1.0, **change}))


def test_rollout_copy_syncs_weights_and_returns_generates_layout(char_tokenizer):
    policy = warm_tiny_lm(char_tokenizer, steps=20)
    copy = RolloutCopy(policy, torch.bfloat16)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01)
    assert not torch.equal(copy.model.lm_head.weight, policy.lm_head.weight.to(torch.bfloat16))
    copy.sync(policy)
    for (name, p), q in zip(policy.named_parameters(), copy.model.parameters(), strict=True):
        assert q.dtype == torch.bfloat16 and torch.equal(q, p.detach().to(torch.bfloat16)), name
    ids, mask = _left_pad([char_tokenizer("3+4=")["input_ids"], char_tokenizer("12+30=")["input_ids"]], 0)
    config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=7,
                              eos_token_id=1, pad_token_id=0)
    out = copy.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    assert out.shape[0] == 2 and ids.shape[1] < out.shape[1] <= ids.shape[1] + 7
    assert torch.equal(out[:, : ids.shape[1]], ids)
    top_k = GenerationConfig(do_sample=True, top_k=3, max_new_tokens=5, eos_token_id=1, pad_token_id=0)
    assert copy.generate(input_ids=ids, attention_mask=mask, generation_config=top_k).shape[0] == 2  # via HF


def test_config_refuses_a_dtype_that_is_not_one(tmp_path):
    from oar.trainer import OARConfig

    with pytest.raises(ValueError, match="oar_rollout_dtype must name a torch dtype.*'bf17'"):
        OARConfig(**grpo_kwargs(str(tmp_path)), credit="grpo", oar_rollout_dtype="bf17")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_trainer_samples_rollouts_from_the_copy_and_trains_the_policy(tmp_path, char_tokenizer, dtype):
    from oar.trainer import OARConfig, OARGRPOTrainer

    model = warm_tiny_lm(char_tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = OARConfig(**grpo_kwargs(str(tmp_path)), credit="oar-g", oar_rollout_dtype=dtype)
    trainer = OARGRPOTrainer(model=model, args=args, processing_class=char_tokenizer, reward_funcs=exact_reward,
                             train_dataset=Dataset.from_list(task_rows(32)))
    calls = []
    served = trainer._rollout_copy.generate

    def spy(*a, **k):  # the copy serving this rollout holds the policy's current weights, cast
        copy_w, policy_w = trainer._rollout_copy.model.lm_head.weight, model.lm_head.weight
        assert torch.equal(copy_w, policy_w.detach().to(copy_w.dtype))
        calls.append(copy_w.float().clone())
        return served(*a, **k)

    trainer._rollout_copy.generate = spy
    trainer.train()
    assert len(calls) == 2  # one rollout batch per step, each from the copy
    assert "generate" not in vars(model)  # the policy's own generate is back after every rollout
    assert any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())
    assert not torch.equal(calls[0], calls[1])  # the second rollout saw the first update
    assert all(math.isfinite(r["loss"]) for r in trainer.state.log_history if "loss" in r)


def test_rows_that_end_leave_the_batch_without_changing_the_others(char_tokenizer):
    """With most rows ending early (their first token is eos), the rows still running sample exactly what they
    sample alone (greedy), and the result keeps every row in its place."""
    model = warm_tiny_lm(char_tokenizer, steps=60)
    prompts = [char_tokenizer(r["prompt"])["input_ids"] for r in task_rows(8)]
    ids, mask = _left_pad(prompts, char_tokenizer.pad_token_id)

    class EndEarly(torch.nn.Module):
        """Rows 0-5 are forced to eos at once; rows 6 and 7 run as the tiny LM samples them."""

        def __init__(self, inner):
            super().__init__()
            self.inner, self.first = inner, True

        def forward(self, **kw):
            out = self.inner(**kw)
            if self.first:
                out.logits[:6, -1] = -1e4
                out.logits[:6, -1, 1] = 0.0
                self.first = False
            return out

    new = sample_tokens(EndEarly(model), ids, mask, max_new_tokens=12, temperature=0.0, eos_token_ids=1,
                        pad_token_id=0)
    assert (new[:6, 0] == 1).all() and (new[:6, 1:] == 0).all()
    for i in (6, 7):
        alone = sample_tokens(model, ids[i:i + 1], mask[i:i + 1], max_new_tokens=12, temperature=0.0,
                              eos_token_ids=1, pad_token_id=0)
        assert torch.equal(new[i, : alone.shape[1]], alone[0]) and (new[i, alone.shape[1]:] == 0).all()
