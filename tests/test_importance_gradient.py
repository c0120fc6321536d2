"""OAR-G: per-row reference, determinism, seeded noise, and no side effects on the model."""

from __future__ import annotations

import pytest
import torch

from helpers import make_tiny_lm
from oar import gradient_scores, perturbation_scores
from test_importance_perturbation import inputs, probe_batch, sharpen


def reference_row(model, pb, b, mode, noise=None):
    """OAR-G of one unpadded row, written directly from OAR_SPEC §3."""
    keep = pb.attention_mask[b].bool()
    ids, reasoning = pb.input_ids[b][keep], pb.reasoning_mask[b][keep]
    answer = pb.answer_mask[b][keep].nonzero().squeeze(1)
    e = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    delta = 0 if noise is None else noise[b][keep] * reasoning[:, None]

    def readout(x):
        logits = model(inputs_embeds=x[None]).logits[0].float()
        if mode == "answer_joint":
            return torch.log_softmax(logits[answer - 1], -1)[torch.arange(len(answer)), ids[answer]].mean()
        if mode == "last":
            return torch.log_softmax(logits[answer[0] - 1], -1)
        return torch.log_softmax(logits[answer - 1].mean(0), -1)

    if mode == "answer_joint":
        objective = -readout(e + delta)
    else:
        with torch.no_grad():
            p0 = readout(e)
        objective = (p0.exp() * (p0 - readout(e + delta))).sum()
    (grad,) = torch.autograd.grad(objective, e)
    out = torch.zeros(pb.input_ids.shape[1])
    out[keep] = (grad * e).sum(-1).abs().detach() * reasoning
    return out


@pytest.fixture(scope="module")
def setup(char_tokenizer):
    return sharpen(make_tiny_lm(len(char_tokenizer), "llama", seed=2)), probe_batch(char_tokenizer)


# prefix_cache_min: 1 runs the prompt columns through the cached no-grad pass, 10**6 never does
@pytest.mark.parametrize("prefix_cache_min", [1, 10**6])
def test_answer_joint_without_noise_is_deterministic_and_matches_per_row(setup, prefix_cache_min):
    model, pb = setup
    kw = {"mode": "answer_joint", "noise_std": 0, "prefix_cache_min": prefix_cache_min}
    a = gradient_scores(model, *inputs(pb), **kw)
    b = gradient_scores(model, *inputs(pb), batch_size=1, **kw)
    assert torch.equal(a, gradient_scores(model, *inputs(pb), **kw))
    ref = torch.stack([reference_row(model, pb, i, "answer_joint") for i in range(pb.input_ids.shape[0])])
    assert ref[pb.reasoning_mask].median() > 1e-3
    torch.testing.assert_close(a, ref, rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(b, ref, rtol=1e-3, atol=1e-6)
    assert (a[~pb.reasoning_mask] == 0).all()


@pytest.mark.parametrize("prefix_cache_min", [1, 10**6])
@pytest.mark.parametrize("mode", ["last", "answer_mean"])
def test_kl_modes_match_per_row_reference_with_the_same_noise(setup, mode, prefix_cache_min):
    model, pb = setup
    B, L = pb.input_ids.shape
    hidden = model.get_input_embeddings().embedding_dim
    noise = torch.randn(B, L, hidden, generator=torch.Generator().manual_seed(7)) * 1e-2
    got = gradient_scores(model, *inputs(pb), mode=mode, noise_std=1e-2,
                          generator=torch.Generator().manual_seed(7), batch_size=2, prefix_cache_min=prefix_cache_min)
    ref = torch.stack([reference_row(model, pb, i, mode, noise) for i in range(B)])
    assert ref[pb.reasoning_mask].abs().median() > 0
    torch.testing.assert_close(got, ref, rtol=2e-3, atol=1e-9)


def test_seeded_noise_is_reproducible_and_batch_size_free(setup):
    model, pb = setup

    def run(seed, batch_size=None):
        gen = torch.Generator().manual_seed(seed)
        return gradient_scores(model, *inputs(pb), mode="answer_mean", generator=gen, batch_size=batch_size)

    a = run(0)
    torch.testing.assert_close(run(0, batch_size=1), a, rtol=1e-2, atol=1e-3 * float(a.max()))
    assert torch.equal(run(0), a)
    assert not torch.equal(run(1), a)
    assert (a[~pb.reasoning_mask] == 0).all() and (a[pb.reasoning_mask] > 0).all()


def test_no_parameter_gradient_leak_and_modes_restored(char_tokenizer):
    model = make_tiny_lm(len(char_tokenizer), "qwen2", seed=4)
    model.config.attention_dropout = 0.5  # dropout must be off while scoring
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    pb = probe_batch(char_tokenizer)
    params = list(model.parameters())
    for i, p in enumerate(params):
        p.grad = None if i % 3 == 0 else torch.randn_like(p)
    params[1].requires_grad_(False)
    before = [None if p.grad is None else p.grad.clone() for p in params]
    model.train()
    model.model.layers[0].eval()  # a mixed train/eval state must come back exactly
    flags = [m.training for m in model.modules()]
    scores = [gradient_scores(model, *inputs(pb), mode="answer_joint", noise_std=0) for _ in range(2)]
    assert torch.equal(scores[0], scores[1])  # would differ with dropout on
    assert [m.training for m in model.modules()] == flags
    assert [p.requires_grad for p in params] == [i != 1 for i in range(len(params))]
    for p, old in zip(params, before, strict=True):
        assert (p.grad is None) if old is None else torch.equal(p.grad, old)


def test_callers_under_no_grad_and_inference_mode(setup):
    model, pb = setup
    expected = gradient_scores(model, *inputs(pb), mode="answer_joint", noise_std=0)
    with torch.no_grad():
        assert torch.equal(gradient_scores(model, *inputs(pb), mode="answer_joint", noise_std=0), expected)
    with torch.inference_mode():
        args = [t.clone() for t in inputs(pb)]
        got = gradient_scores(model, *args, mode="answer_joint", noise_std=0)
    torch.testing.assert_close(got, expected)


def test_ranks_agree_with_perturbation(setup):
    """OAR-G is a proxy of OAR-P: on the same probes their ranks should correlate positively."""
    model, pb = setup
    g = gradient_scores(model, *inputs(pb), mode="answer_joint", noise_std=0)
    p = perturbation_scores(model, *inputs(pb), mode="answer_joint").abs()
    r = pb.reasoning_mask

    def ranks(x):
        return torch.argsort(torch.argsort(x)).float()

    rho = torch.corrcoef(torch.stack([ranks(g[r]), ranks(p[r])]))[0, 1]
    assert rho > 0.1


def test_input_validation(setup):
    model, pb = setup
    with pytest.raises(ValueError, match="noise_std"):
        gradient_scores(model, *inputs(pb), mode="answer_mean", noise_std=0)
    with pytest.raises(ValueError, match="unknown mode"):
        gradient_scores(model, *inputs(pb), mode="mean")
    with pytest.raises(ValueError, match="batch_size"):
        gradient_scores(model, *inputs(pb), batch_size=0)
    ids, am, rm, ans = inputs(pb)
    empty = gradient_scores(model, ids, am, torch.zeros_like(rm), ans)
    assert empty.shape == ids.shape and (empty == 0).all()


def test_prefix_cache_covers_the_columns_before_every_rows_reasoning(setup):
    """The cached pass runs exactly the columns before the earliest reasoning token of the batch, once."""
    model, pb = setup
    cut = int(torch.where(pb.reasoning_mask, torch.arange(pb.input_ids.shape[1]), 10**6).amin())
    assert cut >= 1  # the fixture's probes share a prompt prefix
    widths = []
    handle = model.register_forward_pre_hook(lambda m, a, kw: widths.append(kw["input_ids"].shape[1]),
                                             with_kwargs=True)
    try:
        gradient_scores(model, *inputs(pb), mode="answer_joint", noise_std=0, prefix_cache_min=1)
    finally:
        handle.remove()
    assert widths[0] == cut and len(widths) == 2


@pytest.mark.parametrize("mode", ["answer_mean", "answer_joint"])
def test_long_prompts_take_the_cached_prefix_by_default_with_the_same_scores(char_tokenizer, mode):
    """Prompts of >= 48 tokens (the default threshold) on a sliding-window model (Mistral, window 40): the cached
    prompt gives the scores of the plain passes."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=len(char_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=40, pad_token_id=0,
                        max_position_embeddings=256)
    model = sharpen(MistralForCausalLM(cfg).float().eval())
    pb = probe_batch(char_tokenizer, prompts=["What is 3+4? " * 8, "Compute 12*3, show work " * 4, "Q " * 30])
    cut = int(torch.where(pb.reasoning_mask, torch.arange(pb.input_ids.shape[1]), 10**6).amin())
    assert cut >= 48
    sd = 0.0 if mode == "answer_joint" else 1e-2
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a, kw: calls.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        cached = gradient_scores(model, *inputs(pb), mode=mode, noise_std=sd,
                                 generator=torch.Generator().manual_seed(1))
    finally:
        handle.remove()
    plain = gradient_scores(model, *inputs(pb), mode=mode, noise_std=sd, generator=torch.Generator().manual_seed(1),
                            prefix_cache_min=10**6)
    assert calls[0] == cut  # the default threshold took the cached path
    assert plain[pb.reasoning_mask].abs().median() > 1e-7
    torch.testing.assert_close(cached, plain, rtol=1e-3, atol=2e-3 * float(plain.abs().max()))  # float rounding


def test_defaults_answer_joint_without_noise_and_kl_modes_get_the_spec_noise(setup):
    """No arguments: answer_joint, σ = 0 (deterministic, no generator needed); a KL mode without noise_std gets
    σ = KL_NOISE_STD (OAR_SPEC §3), the same as passing it."""
    from oar.importance.gradient import KL_NOISE_STD

    model, pb = setup
    default = gradient_scores(model, *inputs(pb))
    assert torch.equal(default, gradient_scores(model, *inputs(pb), mode="answer_joint", noise_std=0))
    got = gradient_scores(model, *inputs(pb), mode="answer_mean", generator=torch.Generator().manual_seed(3))
    want = gradient_scores(model, *inputs(pb), mode="answer_mean", noise_std=KL_NOISE_STD,
                           generator=torch.Generator().manual_seed(3))
    assert KL_NOISE_STD == 1e-3 and torch.equal(got, want) and not torch.equal(got, default)
