"""SC-GRPO (arXiv 2606.18810) and GRAIL (arXiv 2606.04889): each against its definition written plainly, one row
at a time without padding, on a tiny model; their fallbacks, options and registration."""

from __future__ import annotations

import pytest
import torch

from oar.credit import CreditBatch, CreditSpec, get_credit, token_credit
from oar.credit.peers.grail import answer_parts, grail_scores
from oar.credit.peers.sc_grpo import sc_grpo_scores, sc_grpo_weights, verified_donors
from oar.probe import rollout_tensors

PROMPTS = ["3+4=", "3+4=", "3+4=", "9-2=", "9-2="]
COMPLETIONS = ["3+4=7; \\boxed{7}", "3+4=8; \\boxed{8}", "so 7 \\boxed{7} ok", "9-2=7; \\boxed{7}", "9-2=6"]
REWARDS = [1.0, 0.0, 1.0, 1.0, 0.0]
GROUP = [0, 0, 0, 1, 1]


def _batch(tok, model, advantages=None) -> CreditBatch:
    p = [tok(x, add_special_tokens=False)["input_ids"] for x in PROMPTS]
    c = [tok(x, add_special_tokens=False)["input_ids"] for x in COMPLETIONS]
    return CreditBatch(*rollout_tensors(p, c), advantages=advantages, rewards=torch.tensor(REWARDS),
                       group=torch.tensor(GROUP), model=model, tokenizer=tok)


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


# --- SC-GRPO -------------------------------------------------------------------------------------------------


def test_the_verified_donor_is_the_first_other_verified_row_of_the_group():
    group = torch.tensor([0, 0, 0, 1, 1, 2])
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    assert verified_donors(group, rewards).tolist() == [2, 0, 0, -1, 3, -1]
    assert verified_donors(group, rewards, min_reward=2.0).tolist() == [-1] * 6


def test_sc_grpo_is_the_kl_to_the_self_conditioned_policy(char_tokenizer, tiny_qwen2):
    """Each row: KL(π(·|x, y<t) ‖ π(·|x, y*, x, y<t)) summed over the vocabulary, written plainly per token."""
    tok, model = char_tokenizer, tiny_qwen2
    batch = _batch(tok, model)
    scores = sc_grpo_scores(batch, batch_size=2)
    donors = {0: 2, 1: 0, 2: 0, 3: None, 4: 3}
    for r, d in donors.items():
        y = _ids(tok, COMPLETIONS[r])
        if d is None:
            assert torch.all(scores[r] == 0), "no other verified completion in the group: no score"
            continue
        x, star = _ids(tok, PROMPTS[r]), _ids(tok, COMPLETIONS[d])
        with torch.no_grad():
            s = torch.log_softmax(model(torch.tensor([x + y])).logits[0].float(), dim=-1)[len(x) - 1 : -1]
            ctx = x + star + x
            t = torch.log_softmax(model(torch.tensor([ctx + y])).logits[0].float(), dim=-1)[len(ctx) - 1 : -1]
        want = (s.exp() * (s - t)).sum(dim=-1)
        torch.testing.assert_close(scores[r, : len(y)], want, rtol=1e-4, atol=1e-6)
        assert torch.all(scores[r, len(y):] == 0) and want.max() > 0
    # only the active rows are scored
    part = sc_grpo_scores(batch, active=torch.tensor([True, False, False, False, True]))
    torch.testing.assert_close(part[0], scores[0], rtol=1e-4, atol=1e-6)  # other batch rows: other rounding
    assert torch.all(part[1:4] == 0)


def test_sc_grpo_weights_keep_the_mass_and_leave_unconditioned_rows_alone():
    scores = torch.tensor([[0.1, 0.3, 0.2, 9.0], [0.0, 0.0, 0.0, 0.0], [0.5, float("nan"), 0.1, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True], [True, True, True, False]])
    w = sc_grpo_weights(scores, mask)
    assert torch.allclose(w[0, :3], torch.tensor([0.5, 1.5, 1.0])) and w[0, 3] == 1
    assert torch.all(w[1:] == 1)


def test_sc_grpo_runs_as_a_group_credit_with_its_controls(char_tokenizer, tiny_qwen2):
    batch = _batch(char_tokenizer, tiny_qwen2)
    tc = token_credit("sc-grpo", batch, batch_size=2)
    n = batch.completion_mask.sum(dim=1)
    for r in (0, 1, 2, 4):
        assert tc.weights[r, : n[r]].mean().item() == pytest.approx(1.0, abs=1e-5)
    assert torch.all(tc.weights[3] == 1)
    shuf = token_credit("shuffle:sc-grpo", batch, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(shuf.weights[0, : n[0]].sort().values, tc.weights[0, : n[0]].sort().values, rtol=1e-4)
    m = get_credit("sc-grpo")
    assert m.needs_group and m.needs_policy and not m.needs_probe and "rule" not in m.options
    with pytest.raises(ValueError, match="needs the rollout group"):
        token_credit("sc-grpo", CreditBatch(batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                            batch.completion_mask, model=tiny_qwen2))


# --- GRAIL ---------------------------------------------------------------------------------------------------


def test_answer_parts_find_the_box_its_content_and_its_closing_brace(char_tokenizer):
    text = "2+2=4 so \\boxed{4} ok"
    start, content, close = answer_parts(char_tokenizer, _ids(char_tokenizer, text))
    assert (start, content, close) == (text.index("\\boxed"), text.index("{") + 1, text.index("}"))
    assert answer_parts(char_tokenizer, _ids(char_tokenizer, "the answer is 4")) is None
    assert answer_parts(char_tokenizer, _ids(char_tokenizer, "\\boxed{4")) is None  # never closed


def _grail_reference(model, tok, prompt: str, completion: str, std, mean, w_min, w_max, temperature=1.0):
    """The official code's formula for one completion, without padding (module docstring of oar.credit.peers.grail)."""
    x, y = _ids(tok, prompt), _ids(tok, completion)
    start, content, close = answer_parts(tok, y)
    ids = torch.tensor([x + y])
    e = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    logp = torch.log_softmax(model(inputs_embeds=e).logits[0].float() / temperature, dim=-1)
    cols = [len(x) + t for t in range(start, close + 1)]
    J = -torch.stack([logp[c - 1, ids[0, c]] for c in cols]).mean()
    (g,) = torch.autograd.grad(J, e)
    s = (g[0] * e[0].detach()).norm(dim=-1)[len(x) - 1 : len(x) - 1 + len(y)]
    log_s = torch.log(s + 1e-8)
    z = (log_s - log_s.mean()) / torch.sqrt(log_s.var(unbiased=False) + 1e-8)
    w = (mean + std * z).clamp(w_min, w_max)
    w[start:content], w[content:close], w[close:] = mean, w_max, mean
    return w


def test_grail_is_the_official_formula_written_plainly(char_tokenizer, tiny_qwen2):
    tok, model = char_tokenizer, tiny_qwen2
    A = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0])
    batch = _batch(tok, model, advantages=A)
    opts = dict(std=0.7, mean=1.0, w_min=0.2, w_max=3.0)
    w = grail_scores(batch, batch_size=2, symmetry="both", temperature=0.8, **opts)
    for r in (0, 1, 2, 3):
        want = _grail_reference(model, tok, PROMPTS[r], COMPLETIONS[r], temperature=0.8, **opts)
        n = len(want)
        torch.testing.assert_close(w[r, :n], want, rtol=1e-4, atol=1e-5)
        assert torch.all(w[r, n:] == 1)
        assert want[: answer_parts(tok, _ids(tok, COMPLETIONS[r]))[0]].std() > 0, "the reasoning is reweighted"
    assert torch.all(w[4] == 1), "no box: uniform"


def test_grail_symmetry_reweights_only_the_chosen_outcome_but_keeps_the_answer_overrides(char_tokenizer, tiny_qwen2):
    tok = char_tokenizer
    A = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0])
    both = grail_scores(_batch(tok, tiny_qwen2, A), symmetry="both")
    wrong = grail_scores(_batch(tok, tiny_qwen2, A))  # default: failures only
    start, content, close = answer_parts(tok, _ids(tok, COMPLETIONS[0]))
    n = len(_ids(tok, COMPLETIONS[0]))
    assert torch.all(wrong[0, :start] == 1), "a success is left at 1 before its answer"
    assert torch.all(wrong[0, content:close] == 5.0) and torch.all(wrong[0, close:n] == 1.0), "the code's overrides"
    assert torch.equal(wrong[1], both[1]), "the failure is reweighted as under 'both'"
    # without advantages the sign is the reward against the group's mean (the verl actors' view)
    assert torch.equal(grail_scores(_batch(tok, tiny_qwen2)), wrong)


def test_grail_registration_options_and_errors(char_tokenizer, tiny_qwen2):
    m = get_credit("grail")
    assert m.options == {"std": 0.5, "mean": 1.0, "w_min": 0.5, "w_max": 5.0, "symmetry": "wrong",
                         "temperature": 1.0}
    assert m.needs_policy and m.needs_group and "rule" not in m.options
    with pytest.raises(ValueError, match="w_min must be <= w_max"):
        CreditSpec.parse("grail@w_min=6").resolve()
    with pytest.raises(ValueError, match="symmetry must be one of 'both', 'correct', 'wrong'"):
        CreditSpec.parse("grail@symmetry=all").resolve()
    batch = _batch(char_tokenizer, tiny_qwen2, torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0]))
    tc = token_credit("grail@symmetry=both", batch, batch_size=3)
    assert torch.equal(tc.weights, grail_scores(batch, symmetry="both").float())
    with pytest.raises(ValueError, match="CreditBatch.tokenizer is None"):
        token_credit("grail", CreditBatch(batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                          batch.completion_mask, advantages=batch.advantages, rewards=batch.rewards,
                                          group=batch.group, model=tiny_qwen2))


@pytest.mark.parametrize("credit", ["sc-grpo", "grail@symmetry=both"])
def test_the_verl_actors_score_and_the_driver_folds_as_token_credit_does(credit, char_tokenizer, tiny_qwen2):
    """Group methods under verl: the actors gather the groups and score (the tokenizer is theirs), the driver folds
    with the rewards and groups: the same token advantages as token_credit on the whole batch."""
    from oar.integrations.verl.core import OARVerlConfig, fold_credit, score_shard

    batch = _batch(char_tokenizer, tiny_qwen2)
    A = torch.tensor([0.5, -1.0, 0.5, 0.7, -0.7])
    cfg = OARVerlConfig(credit=credit, batch_size=2)
    active = torch.ones(5, dtype=torch.bool)
    scores, mask = score_shard(cfg, tiny_qwen2, char_tokenizer, batch.prompt_ids, batch.prompt_mask,
                               batch.completion_ids, batch.completion_mask, active, group_ids=batch.group,
                               rewards=batch.rewards)
    grpo = A[:, None] * batch.completion_mask
    folded, _ = fold_credit(cfg, grpo, batch.completion_mask, scores, mask, active, group_ids=batch.group,
                            rewards=batch.rewards)
    want = token_credit(credit, batch, active=active, batch_size=2)
    assert not torch.all(want.weights == 1)
    torch.testing.assert_close(folded, want.advantages(A) * batch.completion_mask)
