"""``vine`` / ``vine-w``: Monte-Carlo step values (VinePPO) on a toy policy with closed-form success
probabilities, the cost bound, the mass-preserving form, and one OARGRPOTrainer step."""

from __future__ import annotations

import math

import pytest
import torch

from oar.credit import CreditBatch, get_credit, token_credit
from oar.credit.peers.vine import Continuations, RowView, step_boundaries, step_weights

PAD, EOS, A, B, SEP = 0, 1, 2, 3, 4  # toy vocabulary; prompt tokens are 5 + (row's q index)
CHARS = {A: "a", B: "b", SEP: ";"}
QS = (0.7, 0.4, 0.9)
STEPS = 3


class ToyRollout:
    """A toy policy: a completion is 3 steps ``a``/``b`` joined by ``;`` then EOS; each step it writes is ``a`` with
    probability q (set by the prompt token). Reward 1 iff all 3 steps are ``a``: from a state with k steps written,
    none ``b``, the success probability is q^(3-k) (0 once a ``b`` is written)."""

    def __init__(self, prompt_tokens: torch.Tensor, seed: int = 0, strip_leading: bool = False) -> None:
        self.prompt_tokens = prompt_tokens
        self.gen = torch.Generator().manual_seed(seed)
        self.graded = 0
        self.sampled = 0
        self.strip_leading = strip_leading

    def decode(self, ids):
        texts = ["".join(CHARS.get(t, "") for t in row) for row in ids]
        return [t.lstrip(";") for t in texts] if self.strip_leading else texts

    def keys(self):
        return self.prompt_tokens.clone()

    def rows(self, idx):
        return RowView(self, idx)

    def sample(self, prefix_ids, prefix_mask, prefix_lengths, num_samples, temperature=None):
        N = prefix_ids.shape[0]
        q = torch.tensor([QS[int(row[m.bool()][0]) - 5] for row, m in zip(prefix_ids, prefix_mask, strict=True)])
        written = ((prefix_ids == SEP) & prefix_mask.bool()).sum(dim=1)  # prefixes are cut just after a ';'
        left = (STEPS - written).repeat_interleave(num_samples)  # [N·K]
        q = q.repeat_interleave(num_samples)
        steps = torch.where(torch.rand(N * num_samples, STEPS, generator=self.gen) < q[:, None], A, B)
        out = torch.full((N * num_samples, 2 * STEPS), PAD)
        mask = torch.zeros_like(out)
        for j in range(STEPS):  # step j of the continuation at 2j, then ';' (or EOS after the last one)
            live = j < left
            out[:, 2 * j] = torch.where(live, steps[:, j], PAD)
            out[:, 2 * j + 1] = torch.where(live, torch.where(j == left - 1, EOS, SEP), PAD)
            mask[:, 2 * j : 2 * j + 2] = live[:, None].long()
        self.sampled += N * num_samples
        return out, mask

    def reward(self, rows, completion_ids):
        self.graded += len(completion_ids)
        return torch.tensor([float(c.count(A) == STEPS and B not in c) for c in completion_ids])


def completion(steps: str) -> list[int]:
    ids = []
    for i, s in enumerate(steps):
        ids += [A if s == "a" else B, SEP if i < len(steps) - 1 else EOS]
    return ids


def toy_batch(rows: list[tuple[int, str]], seed: int = 0, advantages=None, with_rewards=True, **kw):
    """A batch of completions ``steps`` (e.g. ``"aba"``) answering prompt ``5 + q_index``."""
    comps = [completion(s) for _, s in rows]
    T = max(map(len, comps))
    ids = torch.full((len(rows), T), PAD)
    mask = torch.zeros_like(ids)
    for i, c in enumerate(comps):
        ids[i, : len(c)], mask[i, : len(c)] = torch.tensor(c), 1
    prompts = torch.tensor([[5 + q] for q, _ in rows])
    rollout = ToyRollout(prompts[:, 0], seed, **kw)
    rewards = torch.tensor([float(s == "a" * STEPS) for _, s in rows]) if with_rewards else None
    adv = torch.ones(len(rows)) if advantages is None else torch.as_tensor(advantages, dtype=torch.float32)
    return CreditBatch(prompts, torch.ones_like(prompts), ids, mask, advantages=adv, rewards=rewards,
                       rollout=rollout, model=object())


def closed_form(q: float, steps: str) -> list[float]:
    """Per token of the completion ``steps``: ΔV of its step, V(k steps written) = q^(3-k) while all are ``a``."""
    values = [q**STEPS]
    for k in range(1, len(steps)):
        values.append(q ** (STEPS - k) if "b" not in steps[:k] else 0.0)
    values.append(float(steps == "a" * STEPS))
    return [d for k in range(len(steps)) for d in [values[k + 1] - values[k]] * 2]


def test_toy_rollout_is_a_continuations():
    assert isinstance(toy_batch([(0, "aaa")]).rollout, Continuations)


@pytest.mark.parametrize("strip_leading", [False, True])  # True: pieces don't add up, boundaries by bisection
def test_step_boundaries_follow_the_separator(strip_leading):
    batch = toy_batch([(0, "aaa"), (1, "ab")], strip_leading=strip_leading)
    rows = torch.arange(2)
    assert step_boundaries(batch.rollout, batch.completion_ids, batch.completion_mask, rows, ";", 8) == [[2, 4], [2]]
    # more matches than max_steps: evenly spaced over the matches (the first and the last of 5)
    long = toy_batch([(0, "aaaaaa")])
    rows = torch.arange(1)
    assert step_boundaries(long.rollout, long.completion_ids, long.completion_mask, rows, ";", 2) == [[2, 10]]


def test_mc_step_values_converge_to_the_closed_form():
    cases = [(0, "aaa"), (1, "aba"), (2, "baa"), (0, "aab"), (2, "aaa")]
    K = 2000
    batch = toy_batch(cases)
    credit = token_credit("vine", batch, options={"k": K, "separator": ";"})
    for i, (q, steps) in enumerate(cases):
        n = 2 * len(steps)
        expect = torch.tensor(closed_form(QS[q], steps))
        got = credit.offsets[i, :n]
        # each ΔV is a difference of two means of K Bernoullis: std <= sqrt(2 · 0.25 / K)
        assert torch.allclose(got, expect, atol=5 * math.sqrt(0.5 / K)), (steps, got, expect)
        assert (credit.weights[i, :n] == 0).all()  # replace: the token advantage is ΔV itself
    # telescoping: the step advantages of a row sum to R - V(s_0), per step (two tokens each)
    sums = credit.offsets.sum(dim=1) / 2
    expect = batch.rewards - torch.tensor([QS[q] ** STEPS for q, _ in cases])
    assert torch.allclose(sums, expect, atol=5 * math.sqrt(0.25 / K))
    # the signed ΔV maps onto the right tokens: aba's second step (the b) lowers the value
    assert credit.offsets[1, 2:4].max() < -0.1 and credit.offsets[1, :2].min() > 0


def test_reward_calls_are_bounded_and_exact_for_distinct_states():
    K, max_steps = 3, 2
    cases = [(0, "aaa"), (1, "ab"), (2, "aaaa")]  # 2, 1 and 3 boundaries (the last capped at 2)
    batch = toy_batch(cases)
    active = torch.tensor([True, True, True])
    token_credit("vine", batch, active=active, options={"k": K, "max_steps": max_steps, "separator": ";"})
    states = (2 + 1) + (1 + 1) + (2 + 1)  # the prompt + the chosen boundaries, every state distinct
    assert batch.rollout.graded == states * K == batch.rollout.sampled
    assert batch.rollout.graded <= int(active.sum()) * (max_steps + 1) * K
    # equal states are sampled once: two rows with the same prompt share V(s_0) and V(after their common "a;")
    twins = toy_batch([(0, "aab"), (0, "aba")])
    token_credit("vine", twins, options={"k": K, "separator": ";"})
    assert twins.rollout.graded == (1 + 1 + 2) * K
    # inactive rows cost nothing; no rewards in the batch: the rollout grades the completions once each
    lazy = toy_batch(cases, with_rewards=False)
    token_credit("vine", lazy, active=torch.tensor([False, True, False]), options={"k": K, "separator": ";"})
    assert lazy.rollout.graded == 2 * K + 1


def test_vine_w_preserves_mass_and_leaves_zero_advantage_rows_uniform():
    cases = [(0, "aba"), (1, "aab"), (2, "aaa")]
    batch = toy_batch(cases, advantages=[1.0, -0.5, 0.0])
    credit = token_credit("vine-w", batch, active=batch.advantages != 0, options={"k": 400, "separator": ";"})
    m = batch.completion_mask.bool()
    for i in (0, 1):
        assert credit.weights[i][m[i]].mean().item() == pytest.approx(1.0, abs=1e-5)
    assert (credit.weights[2] == 1).all() and (credit.offsets == 0).all()
    # A > 0 on "aba": the step that lowered the value (the b) gets the floor, the others the mass
    w = credit.weights[0]
    assert w[2] == w[3] == w[4] < 0.6 and w[0] > 1.5
    # A < 0 on "aab": the failing last step carries the blame
    assert credit.weights[1, 4] > 1.5 and credit.weights[1, 0] < 0.5
    # the rule itself
    delta = torch.tensor([[0.5, 0.5, -0.5, -0.5]])
    w = step_weights(delta, torch.ones(1, 4, dtype=torch.bool), torch.tensor([2.0]), eps=0.05)
    assert torch.allclose(w, torch.tensor([[0.55, 0.55, 0.05, 0.05]]) / 0.3)


def test_vine_needs_a_rollout_and_checks_its_options():
    batch = toy_batch([(0, "aaa")])
    bare = CreditBatch(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask,
                       advantages=batch.advantages, model=object())
    with pytest.raises(ValueError, match="needs CreditBatch.rollout"):
        token_credit("vine", bare)
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        token_credit("vine", batch, options={"k": 0})
    with pytest.raises(ValueError, match="separator must be a regular expression"):
        token_credit("vine", batch, options={"separator": "("})
    assert get_credit("vine").combine == "replace" and get_credit("vine-w").combine == "multiply"


def test_rows_keeps_the_rollout_pointing_at_the_same_rows():
    batch = toy_batch([(0, "aaa"), (1, "aba"), (2, "baa")])
    sub = batch.rows(torch.tensor([2, 0]))
    assert sub.rollout.keys().tolist() == [7, 5]
    full = token_credit("vine", batch, options={"k": 300, "separator": ";"}).offsets
    part = token_credit("vine", sub, options={"k": 300, "separator": ";"}).offsets
    assert torch.allclose(part, full[[2, 0]], atol=0.2)


def test_trainer_step_with_vine(tmp_path):
    pytest.importorskip("trl")
    import datasets

    from oar.lab.tokenizer import build_char_tokenizer
    from oar.trainer import OARConfig, OARGRPOTrainer
    from trainer_setup import exact_reward, grpo_kwargs, task_rows, warm_tiny_lm

    calls = []

    def counting_reward(prompts, completions, answer, **kw):
        calls.append(len(completions))
        return exact_reward(prompts, completions, answer)

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    args = OARConfig(**grpo_kwargs(str(tmp_path), max_steps=1), credit='vine@k=2&max_steps=2&separator=" |, "')
    trainer = OARGRPOTrainer(model=warm_tiny_lm(tok), reward_funcs=counting_reward, args=args,
                             train_dataset=datasets.Dataset.from_list(task_rows(16, seed=3)), processing_class=tok)
    trainer.train()
    log = [h for h in trainer.state.log_history if "loss" in h][0]
    for key in ("oar/rollout_states", "oar/rollout_tokens", "oar/rollout_graded", "oar/rollout_steps",
                "oar/frac_scored"):
        assert key in log, key
    scored = round(log["oar/frac_scored"] * 8)
    assert log["oar/rollout_graded"] == sum(calls[1:])  # the first call is TRL's own, on the 8 completions
    assert scored > 0  # the warm tiny LM's groups have reward variance at this seed
    assert 0 < log["oar/rollout_graded"] <= scored * (2 + 1) * 2
    assert log["oar/rollout_tokens"] > 0 and 1 < log["oar/rollout_steps"] <= 3


def test_trl_rollout_shares_each_prefix_cache_and_caps_the_budget():
    pytest.importorskip("trl")
    from types import SimpleNamespace

    from transformers import GenerationConfig

    from helpers import make_tiny_lm
    from oar.lab.tokenizer import build_char_tokenizer
    from oar.trl_rollout import TRLContinuations

    tok = build_char_tokenizer()
    model = make_tiny_lm(len(tok), "qwen2", hidden=32, seed=0).eval()
    cfg = GenerationConfig(do_sample=False, pad_token_id=0, eos_token_id=[1], return_dict_in_generate=False)
    trainer = SimpleNamespace(processing_class=tok, max_completion_length=6, reward_funcs=[], generation_config=cfg,
                              eos_token_ids=[1], args=SimpleNamespace(gradient_checkpointing_kwargs=None))
    ids = torch.tensor([[0, 0, 5, 16, 27], [8, 3, 40, 11, 2]])
    mask = (ids != 0).long()
    rollout = TRLContinuations(trainer, [], model)
    cont, cmask = rollout.sample(ids, mask, torch.tensor([1, 4]), 3)  # budgets 5 and 2 new tokens
    plain = model.generate(input_ids=ids.repeat_interleave(3, 0), attention_mask=mask.repeat_interleave(3, 0),
                           max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=1)[:, 5:]
    assert cont.shape == (6, 5)
    stop = (plain == 1).int().argmax(dim=1).where((plain == 1).any(dim=1), torch.tensor(5)) + 1  # through EOS
    assert cmask.sum(dim=1).tolist() == torch.minimum(stop, torch.tensor([5, 5, 5, 2, 2, 2])).tolist()
    assert torch.equal(cont[cmask.bool()], plain[cmask.bool()])  # the shared cache changes nothing
