"""The fast paths of the LM step (issue #47): teacher-forced passes with the head on completion positions and shared
prompts (oar.teacher_forcing), loss micro-batches of whole prompt groups (oar.trl_loss), the shared prefill and
oar's sampler on the policy (oar.sampling) — each the same function as the plain path, to rounding."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers import make_tiny_lm
from trainer_setup import exact_reward, grpo_kwargs, task_rows, warm_tiny_lm

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

from oar import sampling, teacher_forcing  # noqa: E402
from oar.teacher_forcing import completion_logprobs, head_logprobs, supports_fast_pass  # noqa: E402
from oar.trainer import OARConfig, OARGRPOTrainer  # noqa: E402
from oar.trl_loss import loss_chunks, take_rows  # noqa: E402


def _grouped_rows(vocab: int, groups: int = 2, group: int = 3, P: int = 8, C: int = 6, seed: int = 0):
    """Left-padded prompts repeated ``group`` times, then right-padded completions of different lengths."""
    gen = torch.Generator().manual_seed(seed)
    ids, mask = [], []
    for g in range(groups):
        n = P - 2 * g
        prompt = torch.randint(3, vocab, (n,), generator=gen)
        for k in range(group):
            keep = C - k
            tail = torch.randint(3, vocab, (C,), generator=gen)
            row = torch.cat([torch.zeros(P - n, dtype=torch.long), prompt, tail])
            m = torch.cat([torch.zeros(P - n), torch.ones(n), (torch.arange(C) < keep).float()]).long()
            ids.append(row.masked_fill(m == 0, 0))
            mask.append(m)
    return torch.stack(ids), torch.stack(mask)


def _plain(model, ids, mask, C, temperature):
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -C - 1:-1].float() / temperature
    logp = logits.log_softmax(-1)
    lp = logp.gather(2, ids[:, -C:, None]).squeeze(2)
    ent = -(logp.exp() * logp).sum(-1)
    keep = mask[:, -C:]
    return lp * keep, ent * keep


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_completion_logprobs_and_gradients_equal_the_full_logits_pass(share, arch):
    model = make_tiny_lm(300, arch).train()
    assert supports_fast_pass(model)
    ids, mask = _grouped_rows(300)
    weight = torch.arange(ids.shape[0] * 6, dtype=torch.float32).view(-1, 6)  # a different gradient per token
    grads = []
    for fast in (False, True):
        model.zero_grad()
        lp, ent = (completion_logprobs(model, ids, mask, 6, temperature=0.7, share_prompt=share) if fast
                   else _plain(model, ids, mask, 6, 0.7))
        (lp * weight).sum().backward()
        grads.append(({n: p.grad.clone() for n, p in model.named_parameters()}, lp.detach(), ent.detach()))
    (g0, lp0, e0), (g1, lp1, e1) = grads
    torch.testing.assert_close(lp1, lp0, atol=2e-6, rtol=0)
    torch.testing.assert_close(e1, e0, atol=5e-6, rtol=0)
    for name in g0:  # float32 rounding, relative to the tensor's largest entry
        assert (g1[name] - g0[name]).abs().max() <= 1e-5 * g0[name].abs().max(), name
    assert (lp1[mask[:, -6:] == 0] == 0).all()


def test_head_logprobs_in_many_chunks_equals_one(monkeypatch):
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(37, 16, generator=gen, requires_grad=True)
    w = torch.randn(50, 16, generator=gen, requires_grad=True)
    labels = torch.randint(0, 50, (37,), generator=gen)
    out = []
    for chunk in (2**25, 50 * 5):  # one chunk, then chunks of 5 rows
        monkeypatch.setattr(teacher_forcing, "CHUNK_ELEMENTS", chunk)
        h.grad = w.grad = None
        lp, ent = head_logprobs(h, w, labels, temperature=1.3)
        (lp * torch.linspace(-1, 2, 37)).sum().backward()
        out.append((lp.detach(), ent, h.grad.clone(), w.grad.clone()))
    for a, b in zip(*out, strict=True):
        torch.testing.assert_close(a, b)
    ref = (h @ w.T / 1.3).log_softmax(-1).gather(1, labels[:, None]).squeeze(1)
    torch.testing.assert_close(out[0][0], ref.detach())


def test_completion_logprobs_refuses_a_row_without_prompt():
    model = make_tiny_lm(50)
    with pytest.raises(ValueError, match="at least one prompt token"):
        completion_logprobs(model, torch.ones(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), 4)


def test_loss_chunks_keep_prompts_whole_and_weigh_to_the_batch():
    ids, mask = _grouped_rows(300, groups=3, group=3)
    perm = torch.tensor([4, 0, 8, 1, 5, 2, 7, 3, 6])  # the groups interleaved, as TRL's shuffle leaves them
    inputs = {"prompt_ids": ids[perm, :8], "prompt_mask": mask[perm, :8], "completion_mask": mask[perm, 8:],
              "num_items_in_batch": torch.tensor(40), "advantages": torch.arange(9.0)}
    for loss_type, total in (("grpo", 1.0), ("bnpo", 1.0), ("dapo", None)):
        chunks = loss_chunks(inputs, 4, loss_type)
        assert [c.numel() for c, _ in chunks] == [3, 3, 3]  # 3 + 3 > 4: one prompt a micro-batch
        for idx, _ in chunks:
            assert len({tuple(r) for r in inputs["prompt_ids"][idx].tolist()}) == 1
        assert sorted(torch.cat([c for c, _ in chunks]).tolist()) == list(range(9))
        weights = [w for _, w in chunks]
        assert sum(weights) == pytest.approx(total) if total else weights == [1.0, 1.0, 1.0]
    assert [c.numel() for c, _ in loss_chunks(inputs, 6, "grpo")] == [6, 3]
    assert loss_chunks(inputs, 9, "grpo") is None
    part = take_rows(inputs, torch.tensor([2, 0]))
    assert part["advantages"].tolist() == [2.0, 0.0] and part["num_items_in_batch"] is inputs["num_items_in_batch"]


def _train(model, tokenizer, args, peer: bool):
    ds = datasets.Dataset.from_list(task_rows(32, seed=3))
    cls = trl.GRPOTrainer if peer else OARGRPOTrainer
    trainer = cls(model=model, reward_funcs=exact_reward, args=args, train_dataset=ds, processing_class=tokenizer)
    trainer.train()
    return trainer


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo"])
@pytest.mark.parametrize("share, rows", [(True, None), (False, 2), (True, 2)])
def test_fast_loss_paths_train_like_trls_loss(tmp_path, char_tokenizer, loss_type, share, rows):
    """One SGD update from the same rollouts (gradient accumulation over two micro-batches of 4 rows, groups of 2):
    TRL's GRPOTrainer and OARGRPOTrainer with the shared-prompt pass and/or loss micro-batches end at the same
    weights, to float32 rounding, and log the same loss."""
    base = warm_tiny_lm(char_tokenizer)
    kw = grpo_kwargs(str(tmp_path), loss_type=loss_type, max_steps=1, per_device_train_batch_size=4,
                     gradient_accumulation_steps=2, num_generations=2, optim="sgd", learning_rate=0.5)
    peer = _train(copy.deepcopy(base), char_tokenizer, trl.GRPOConfig(**kw), peer=True)
    ours = _train(copy.deepcopy(base), char_tokenizer,
                  OARConfig(**kw, credit="grpo", oar_share_prompt=share, oar_loss_batch_size=rows), peer=False)
    moved = False
    for (name, a), b in zip(peer.model.named_parameters(), ours.model.parameters(), strict=True):
        step = a.detach() - base.get_parameter(name).detach()
        assert (b - a).abs().max() <= 1e-5 * step.abs().max() + 1e-7, name  # rounding, relative to the update
        moved |= bool(step.abs().max() > 0)
    assert moved, "the update did not move the weights"
    loss = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (peer, ours)]
    assert loss[1] == pytest.approx(loss[0], rel=1e-5, abs=1e-7)


def test_loss_micro_batches_are_refused_with_a_reason_where_inexact(tmp_path, char_tokenizer, caplog):
    kw = grpo_kwargs(str(tmp_path), top_entropy_quantile=0.5)
    trainer = OARGRPOTrainer(model=warm_tiny_lm(char_tokenizer), reward_funcs=exact_reward,
                             args=OARConfig(**kw, credit="grpo", oar_loss_batch_size=2),
                             train_dataset=datasets.Dataset.from_list(task_rows(8)), processing_class=char_tokenizer)
    assert trainer._loss_batch_size is None
    assert "oar_loss_batch_size=2 is not used" in caplog.text and "top_entropy_quantile" in caplog.text
    with pytest.raises(ValueError, match="oar_loss_batch_size"):
        OARConfig(**kw, oar_loss_batch_size=0)


def test_the_shared_prefill_samples_what_one_prefill_per_row_samples(monkeypatch):
    model = make_tiny_lm(60, "llama")
    ids, mask = _grouped_rows(60, groups=2, group=4, C=0)
    first, inverse = sampling.distinct_rows(ids)
    assert first.tolist() == [0, 4] and inverse.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    out = []
    for shared in (True, False):
        if not shared:  # every row its own prefill
            monkeypatch.setattr(sampling, "distinct_rows", lambda rows: (torch.arange(rows.shape[0]),) * 2)
        gen = torch.Generator().manual_seed(5)
        out.append(sampling.sample_tokens(model, ids, mask, max_new_tokens=12, temperature=1.0, eos_token_ids=1,
                                          pad_token_id=0, generator=gen))
    assert torch.equal(out[0], out[1]) and out[0].shape[1] > 1


def test_fast_sampler_serves_trls_generate_on_the_policy(tmp_path, char_tokenizer, monkeypatch):
    calls = []
    real = sampling.sample_tokens

    def spy(model, *a, **kw):
        calls.append(model)
        return real(model, *a, **kw)

    monkeypatch.setattr(sampling, "sample_tokens", spy)
    kw = grpo_kwargs(str(tmp_path), max_steps=1, top_k=0, top_p=1.0)
    trainer = _train(warm_tiny_lm(char_tokenizer), char_tokenizer, OARConfig(**kw, credit="grpo",
                                                                           oar_fast_sampler=True), peer=False)
    assert calls and all(m is trainer.model for m in calls)  # the policy itself, no copy
    assert "generate" not in vars(trainer.model)  # the served generate is removed after the rollout


@pytest.mark.parametrize("mode", ["answer_joint", "answer_mean"])
def test_oar_g_shares_a_groups_prompt_pass_with_the_same_scores(monkeypatch, mode):
    from oar.importance import gradient

    model = make_tiny_lm(300, "llama")
    ids, mask = _grouped_rows(300, groups=2, group=3, P=8, C=10)  # prompts of 8 and 6 tokens: under the 48 minimum
    reasoning = torch.zeros_like(mask, dtype=torch.bool)
    answer = torch.zeros_like(reasoning)
    reasoning[:, 8:12] = True
    answer[:, 12:14] = True
    out = []
    for shared in (True, False):
        if not shared:  # no row shares its prefix: the prompt runs with the rest (no cache under 48 tokens)
            monkeypatch.setattr(gradient, "distinct_rows", lambda rows: (torch.arange(rows.shape[0]),) * 2)
        gen = torch.Generator().manual_seed(0)
        out.append(gradient.gradient_scores(model, ids, mask, reasoning, answer, mode=mode, generator=gen))
    assert out[0][reasoning].abs().sum() > 0
    torch.testing.assert_close(out[0], out[1], atol=1e-6, rtol=1e-4)
