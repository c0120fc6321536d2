"""OAR-P: the fast path equals the naive definition; it batches, reuses the prefix cache, reads few logits."""

from __future__ import annotations

import pytest
import torch

from helpers import make_tiny_lm
from oar import OutcomeProbe, perturbation_scores, rollout_tensors
from oar.importance import line_segments, perturbation_scores_naive

MODES = ("last", "answer_mean", "answer_joint")
PROMPTS = ["What is 3+4?", "Compute 12*3, show work", "Q"]
COMPLETIONS = [
    "3+4=7. So the sum is 7.\n\\boxed{7}",
    "12*3 = 12*2 + 12 = 24 + 12 = 36\nThe answer is \\boxed{36}<eos>",
    "x\ny\n\\boxed{-1/2}",
]


def sharpen(model, factor: float = 20.0):
    """Scale the matrices of a random model so its outputs are peaked and the scores far from zero."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(factor**0.5)
    return model


def probe_batch(tok, prompts=PROMPTS, completions=COMPLETIONS):
    encode = [[tok(x, add_special_tokens=False)["input_ids"] for x in texts] for texts in (prompts, completions)]
    pb = OutcomeProbe(tok)(*rollout_tensors(*encode))
    assert pb.valid.all()
    return pb


def inputs(pb):
    return pb.input_ids, pb.attention_mask, pb.reasoning_mask, pb.answer_mask


def assert_exact(fast, naive):
    """The issue's bar (1e-4 in float32) plus a relative one, so tiny scores cannot pass trivially."""
    assert (fast - naive).abs().max() < 1e-4
    torch.testing.assert_close(fast, naive, rtol=1e-3, atol=2e-6)


@pytest.fixture(scope="module")
def sharp_qwen2(char_tokenizer):
    return sharpen(make_tiny_lm(len(char_tokenizer), "qwen2"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_fast_equals_naive_on_a_padded_batch(char_tokenizer, mode, arch):
    model = sharpen(make_tiny_lm(len(char_tokenizer), arch, seed=1))
    pb = probe_batch(char_tokenizer)
    assert len(set(pb.attention_mask.sum(dim=1).tolist())) == 3  # rows of different lengths
    naive = perturbation_scores_naive(model, *inputs(pb), mode=mode)
    r = pb.reasoning_mask
    assert naive[r].abs().median() > 1e-4  # informative scale
    assert (naive[~r] == 0).all()
    for chunk_size in (1, 7, 64):
        fast = perturbation_scores(model, *inputs(pb), mode=mode, chunk_size=chunk_size)
        assert_exact(fast, naive)
        assert (fast[~r] == 0).all()


def test_naive_matches_the_definition_by_hand(char_tokenizer, sharp_qwen2):
    """One copy computed directly from the model, independent of both implementations."""
    model, pb = sharp_qwen2, probe_batch(char_tokenizer)
    b, n = 1, int(pb.attention_mask[1].sum())
    ids = pb.input_ids[b, :n]
    t = int(pb.reasoning_mask[b].nonzero()[4])
    answer = pb.answer_mask[b, :n].nonzero().squeeze(1)
    perturbed = ids.clone()
    perturbed[t] = model.config.pad_token_id
    with torch.no_grad():
        clean_logits, new_logits = model(torch.stack([ids, perturbed])).logits.float()
    p_clean = torch.softmax(clean_logits[answer[0] - 1], -1)
    p_new = torch.softmax(new_logits[answer[0] - 1], -1)
    kl = (p_clean * (p_clean.log() - p_new.log())).sum()
    phi = [torch.log_softmax(lg[answer - 1], -1)[torch.arange(len(answer)), ids[answer]].mean()
           for lg in (clean_logits, new_logits)]
    for mode, expected in (("last", kl), ("answer_joint", phi[0] - phi[1])):
        for fn in (perturbation_scores, perturbation_scores_naive):
            got = fn(model, *inputs(pb), mode=mode)[b, t]
            torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-6)


def test_padding_side_does_not_matter(char_tokenizer, sharp_qwen2):
    pb = probe_batch(char_tokenizer)
    ids, am, rm, ans = inputs(pb)
    shift = (am.shape[1] - am.sum(dim=1))[:, None]  # move every row to the right (left padding)
    idx = (torch.arange(am.shape[1])[None, :] - shift) % am.shape[1]
    left = [t.gather(1, idx) for t in (ids, am, rm.long(), ans.long())]
    left_scores = perturbation_scores(sharp_qwen2, left[0], left[1], left[2].bool(), left[3].bool())
    right_scores = perturbation_scores(sharp_qwen2, ids, am, rm, ans)
    assert_exact(left_scores.gather(1, (torch.arange(am.shape[1])[None, :] + shift) % am.shape[1]),
                 right_scores)
    assert_exact(perturbation_scores_naive(sharp_qwen2, left[0], left[1], left[2].bool(), left[3].bool()),
                 left_scores)


def test_span_windows(char_tokenizer, sharp_qwen2):
    tok = char_tokenizer
    pb = probe_batch(tok)
    model = sharp_qwen2
    token = perturbation_scores(model, *inputs(pb))
    assert_exact(perturbation_scores(model, *inputs(pb), span=1), token)
    for span in (3, line_segments(pb.input_ids, pb.reasoning_mask, tok)):
        fast = perturbation_scores(model, *inputs(pb), span=span, chunk_size=2)
        assert_exact(fast, perturbation_scores_naive(model, *inputs(pb), span=span))
    by3 = perturbation_scores(model, *inputs(pb), span=3)
    row = by3[0][pb.reasoning_mask[0]]
    assert torch.equal(row[0:3], row[0].expand(3)) and row[0] != row[3]
    with pytest.raises(ValueError, match="span"):
        perturbation_scores(model, *inputs(pb), span=0)


def test_chunks_reuse_the_prefix_and_read_few_logits(char_tokenizer, sharp_qwen2):
    """Structural check of the fast path: batch <= chunk_size, suffix-only inputs, logits [C, K<=|answer|, V]."""
    model, pb = sharp_qwen2, probe_batch(char_tokenizer)
    calls = []

    def record(module, args, kwargs, output):
        x = kwargs.get("input_ids", args[0] if args else None)
        calls.append((tuple(x.shape), tuple(output.logits.shape), kwargs.get("past_key_values") is not None))

    handle = model.register_forward_hook(record, with_kwargs=True)
    try:
        perturbation_scores(model, *inputs(pb), mode="answer_mean", chunk_size=4)
    finally:
        handle.remove()
    lengths = pb.attention_mask.sum(dim=1)
    n_answer = pb.answer_mask.sum(dim=1).max()
    assert all(x[0] <= 4 and logits[1] <= n_answer for x, logits, _ in calls)
    assert max(x[1] for x, _, _ in calls) <= lengths.max()
    copies = [(x, cached) for x, _, cached in calls if x[0] == 4]
    assert copies and all(cached for _, cached in copies)
    pos = torch.arange(pb.input_ids.shape[1])
    first_reasoning = torch.where(pb.reasoning_mask, pos, 10**6).amin(dim=1)
    last_answer = torch.where(pb.answer_mask, pos, -1).amax(dim=1)
    suffix = int((last_answer - first_reasoning).max())  # from the first perturbable token, "}" excluded
    assert all(x[1] <= suffix for x, _ in copies)
    n_reasoning = int(pb.reasoning_mask.sum())
    assert len(calls) < n_reasoning  # far fewer forwards than copies


def test_zero_rows_and_model_state(char_tokenizer, sharp_qwen2):
    model, pb = sharp_qwen2, probe_batch(char_tokenizer)
    ids, am, rm, ans = inputs(pb)
    rm = rm.clone()
    rm[1] = False
    model.train()
    try:
        scores = perturbation_scores(model, ids, am, rm, ans)
        assert model.training and all(m.training for m in model.modules())
    finally:
        model.eval()
    assert (scores[1] == 0).all() and (scores[0][rm[0]] > 0).any()
    assert not any(p.grad is not None for p in model.parameters())


def test_replace_id_and_dtype(char_tokenizer):
    model = sharpen(make_tiny_lm(len(char_tokenizer), "qwen2", seed=3))
    pb = probe_batch(char_tokenizer)
    by_pad = perturbation_scores(model, *inputs(pb))
    by_other = perturbation_scores(model, *inputs(pb), replace_id=5)
    assert_exact(by_other, perturbation_scores_naive(model, *inputs(pb), replace_id=5))
    assert not torch.allclose(by_pad, by_other)
    half = perturbation_scores(model.to(torch.bfloat16), *inputs(pb))
    assert half.dtype == torch.float32 and torch.isfinite(half).all()
    r = pb.reasoning_mask
    assert torch.corrcoef(torch.stack([half[r], by_pad[r]]))[0, 1] > 0.8


def test_input_validation(char_tokenizer, sharp_qwen2):
    model, pb = sharp_qwen2, probe_batch(char_tokenizer)
    ids, am, rm, ans = inputs(pb)
    with pytest.raises(ValueError, match="unknown mode.*last, answer_mean, answer_joint"):
        perturbation_scores(model, ids, am, rm, ans, mode="first")
    with pytest.raises(ValueError, match="shape"):
        perturbation_scores(model, ids, am[:, :-1], rm, ans)
    with pytest.raises(ValueError, match="bool"):
        perturbation_scores(model, ids, am, rm.long(), ans)
    with pytest.raises(ValueError, match="precede"):
        perturbation_scores(model, ids, am, rm | ans, ans)
    with pytest.raises(ValueError, match="chunk_size"):
        perturbation_scores(model, ids, am, rm, ans, chunk_size=0)
    no_pad = make_tiny_lm(len(char_tokenizer), "qwen2")
    no_pad.config.pad_token_id = None
    with pytest.raises(ValueError, match="replace_id"):
        perturbation_scores(no_pad, ids, am, rm, ans)


@pytest.mark.parametrize("mode", MODES)
def test_sliding_window_model_equals_naive(char_tokenizer, mode):
    """A sliding-window model (Mistral, window 40 < the probes, 50-112 tokens): the copies' cached prefixes hold every
    column, and the model's masks apply the window."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=len(char_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=40, pad_token_id=0,
                        max_position_embeddings=256)
    model = sharpen(MistralForCausalLM(cfg).float().eval())
    pb = probe_batch(char_tokenizer)
    naive = perturbation_scores_naive(model, *inputs(pb), mode=mode)
    assert (naive[pb.reasoning_mask].abs() > 1e-4).sum() >= 20  # an informative scale
    assert_exact(perturbation_scores(model, *inputs(pb), mode=mode, chunk_size=7), naive)
    assert_exact(perturbation_scores(model, *inputs(pb), mode=mode, chunk_size=7, horizon=3),
                 perturbation_scores_naive(model, *inputs(pb), mode=mode, horizon=3))


@pytest.mark.parametrize("mode", MODES)
def test_horizon_fast_equals_its_naive_definition(char_tokenizer, mode):
    """``horizon=W``: the batched engine equals the plain definition (full forward per copy, keys/values after W
    positions past the window swapped for the clean ones, answer positions re-run), for tokens and windows."""
    model = sharpen(make_tiny_lm(len(char_tokenizer), "qwen2", seed=1))
    pb = probe_batch(char_tokenizer)
    for horizon in (0, 3):
        naive = perturbation_scores_naive(model, *inputs(pb), mode=mode, horizon=horizon)
        assert naive[pb.reasoning_mask].abs().median() > 1e-4
        for chunk_size in (1, 7, 64):
            assert_exact(perturbation_scores(model, *inputs(pb), mode=mode, chunk_size=chunk_size, horizon=horizon),
                         naive)
    assert_exact(perturbation_scores(model, *inputs(pb), mode=mode, span=3, horizon=2, chunk_size=5),
                 perturbation_scores_naive(model, *inputs(pb), mode=mode, span=3, horizon=2))


def test_horizon_is_an_approximation_that_becomes_exact(char_tokenizer, sharp_qwen2):
    """A horizon reaching the answer is exact OAR-P; a short one differs from it (stale keys/values) except on
    the tokens whose horizon reaches the answer anyway."""
    model, pb = sharp_qwen2, probe_batch(char_tokenizer)
    exact = perturbation_scores(model, *inputs(pb))
    assert_exact(perturbation_scores(model, *inputs(pb), horizon=pb.input_ids.shape[1]), exact)
    W = 40  # the probe puts ~40 conclusion tokens ("Therefore, the final answer is ...") before the readout
    short = perturbation_scores(model, *inputs(pb), horizon=W)
    r = pb.reasoning_mask
    pos = torch.arange(r.shape[1]).expand_as(r)
    first_answer = torch.where(pb.answer_mask, pos, r.shape[1]).amin(dim=1, keepdim=True)
    near = r & (pos + W >= first_answer - 2)  # re-run up to the readout position's predecessor: nothing is stale
    assert near.any() and (r & ~near).any()
    torch.testing.assert_close(short[near], exact[near], rtol=1e-3, atol=2e-6)
    far = r & ~near
    assert ((short[far] - exact[far]).abs() / exact[far].abs()).max() > 0.05  # stale keys/values: not exact
    assert (short[~r] == 0).all()
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="horizon"):
            perturbation_scores(model, *inputs(pb), horizon=bad)
