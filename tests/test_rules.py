"""Reshaping rules (oar.reshape: bilevel, sign, process, step) and the `rule` option of every importance credit:
each rule's invariants on hand-built batches, the controls under every rule, every entry point's credit value."""

from __future__ import annotations

import math

import pytest
import torch

import oar.lab  # noqa: F401  (registers the lab's oracles, importance credits too)
from oar.credit import CreditBatch, CreditSpec, credit_names, get_credit, reverse_ranks, token_credit
from oar.lab.oracle import blame_scores, flagged_only
from oar.probe import OutcomeProbe
from oar.reshape import (
    RULES,
    SIGN_EPS,
    bilevel_weights,
    process_weights,
    rule_weights,
    sign_weights,
    step_weights,
)
from oar.steps import step_ends, step_ids

IMPORTANCE_CREDITS = ("oar-g", "oar-p", "oar-pg", "oar-prefix", "entropy", "random", "oracle-oar", "oracle-process")


def _rows(*rows: list[float], width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``[B, T]`` float64 scores (junk in the padding) and their mask."""
    width = width or max(len(r) for r in rows)
    scores = torch.full((len(rows), width), 9.0, dtype=torch.float64)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        scores[i, : len(r)] = torch.tensor(r, dtype=torch.float64)
        mask[i, : len(r)] = True
    return scores, mask


def _masked_mean(w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (w * mask).sum(dim=1) / mask.sum(dim=1)


# --- sign (TASPO) --------------------------------------------------------------------------------------------


def test_sign_keeps_the_mass_stays_in_the_bound_and_follows_the_sign():
    scores, mask = _rows([0.0, 1.0, 3.0, 10.0, 0.5], [5.0, 0.1, 2.0, 0.0], [1.0, 2.0, 3.0], width=7)
    A = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)
    for eta, eps in ((1.0, 0.5), (0.2, 0.5), (10.0, 0.05), (0.0, 0.5)):
        w = sign_weights(scores, mask, A, tau=1.0, eta=eta, eps=eps)
        assert torch.all(w[~mask] == 1)
        assert torch.allclose(_masked_mean(w, mask)[:2], torch.ones(2, dtype=torch.float64), atol=1e-12)
        assert torch.all((w[mask] >= 1 - eps - 1e-12) & (w[mask] <= 1 + eps + 1e-12))
    w = sign_weights(scores, mask, A)
    assert torch.all(w[2] == 1), "A = 0: no sign, no redistribution"
    # a success moves weight onto its most important token, a failure away from it
    assert w[0, 3] == w[0, :5].max() and w[0, 0] == w[0, :5].min()
    assert w[1, 0] == w[1, :4].min() and w[1, 3] == w[1, :4].max()


def test_sign_is_the_quoted_formula_where_the_bound_does_not_bind():
    scores, mask = _rows([0.0, 1.0, 3.0])
    A = torch.tensor([2.0], dtype=torch.float64)
    s = torch.log1p(scores[0])
    d = (s - s.min()) / (s.max() - s.min())
    q = torch.tanh(d / 0.5)
    expected = 1 + 0.1 * (q - q.mean())  # |0.1 (q - q̄)| < 0.5: no shrink
    assert torch.allclose(sign_weights(scores, mask, A, tau=0.5, eta=0.1, eps=0.5)[0], expected, atol=1e-12)
    # where eta would leave the bound, the deviation is shrunk so that the extreme weight sits on it
    w = sign_weights(scores, mask, A, tau=0.5, eta=5.0, eps=0.3)[0]
    dev = q - q.mean()
    assert torch.allclose(w, 1 + 0.3 * dev / dev.abs().max(), atol=1e-12)
    assert (w - 1).abs().max().item() == pytest.approx(0.3)


def test_sign_gives_ones_on_degenerate_rows():
    scores, mask = _rows([2.0, 2.0, 2.0], [1.0], [1.0, float("nan"), 3.0])
    A = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    assert torch.all(sign_weights(scores, mask, A) == 1)


# --- process -------------------------------------------------------------------------------------------------


def test_process_zeroes_the_tokens_before_the_decisive_step_of_a_failed_row():
    # steps (by boundary token 0): [1 2 0] [3 4 0] [5 6]; the most important token (9.0) is in step 1
    ids = torch.tensor([[1, 2, 0, 3, 4, 0, 5, 6], [1, 2, 0, 3, 4, 0, 5, 6], [1, 2, 0, 3, 4, 0, 5, 6]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    steps = step_ids(ids, mask, torch.tensor([0]))
    assert steps[0].tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    scores = torch.tensor([[0.5, 1.0, 0.2, 0.0, 9.0, 0.1, 2.0, 9.0]] * 3, dtype=torch.float64)
    A = torch.tensor([-1.0, 1.0, 0.0], dtype=torch.float64)
    w = process_weights(scores, mask, A, steps)
    # step 1's first token has importance 0: the failure starts at its first important token
    assert w[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1], "0 before the decisive step, 1 from it on"
    assert torch.all(w[1:] == 1), "successes (and A = 0) keep weight 1"
    assert _masked_mean(w, mask)[0] < 1, "mass not preserved"


def test_process_on_uniform_or_nonfinite_importance_changes_nothing():
    ids = torch.tensor([[1, 0, 2, 3], [1, 0, 2, 3], [1, 0, 2, 3]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    steps = step_ids(ids, mask, torch.tensor([0]))
    scores = torch.tensor([[0.0] * 4, [1.0] * 4, [1.0, float("inf"), 0.0, 2.0]], dtype=torch.float64)
    w = process_weights(scores, mask, torch.full((3,), -1.0, dtype=torch.float64), steps)
    assert torch.all(w == 1)


def test_process_on_blame_importance_is_process_supervision_whatever_the_steps():
    """With the lab's perfect blame importance the rule is exactly the first-error form (oracle-process's stored
    behaviour, ``flagged_only``), for any step segmentation, including steps that start before the blamed token."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        B, T = 6, 20
        lengths = torch.randint(1, T + 1, (B,), generator=gen)
        mask = torch.arange(T)[None, :] < lengths[:, None]
        start = (torch.rand(B, generator=gen) * lengths).long()
        blamed = (torch.rand(B, generator=gen) < 0.7)[:, None] & (torch.arange(T)[None, :] >= start[:, None]) & mask
        scores = blamed.float()
        ids = torch.randint(0, 4, (B, T), generator=gen)  # token 0 ends a step: arbitrary segmentations
        steps = step_ids(ids, mask, torch.tensor([0]))
        A = torch.where(blamed.any(dim=1), -1.0, torch.randn(B, generator=gen).abs())
        reference = torch.where(mask, flagged_only(scores, mask), 1.0)  # 1 off the mask, as every effect's weights
        assert torch.equal(process_weights(scores, mask, A, steps), reference)


# --- step ----------------------------------------------------------------------------------------------------


def test_step_gives_one_weight_per_step_bilevel_over_step_sums_and_mean_one():
    ids = torch.tensor([[5, 6, 0, 7, 0, 8, 9, 9, 0, 4, 4, 4], [5, 0, 6, 0, 7, 0, 8, 1, 1, 1, 1, 1]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 7:] = False
    steps = step_ids(ids, mask, torch.tensor([0]))
    gen = torch.Generator().manual_seed(1)
    scores = torch.rand(ids.shape, generator=gen, dtype=torch.float64) * 3
    w = step_weights(scores, mask, steps, tau=0.3)
    assert torch.allclose(_masked_mean(w, mask), torch.ones(2, dtype=torch.float64), atol=1e-12)
    assert torch.all(w[~mask] == 1)
    for r in range(2):
        n_steps = int(steps[r][mask[r]].max()) + 1
        sums = torch.stack([scores[r][mask[r] & (steps[r] == k)].sum() for k in range(n_steps)])
        per_step = bilevel_weights(sums[None], torch.ones(1, n_steps, dtype=torch.bool), tau=0.3)[0]
        lengths = torch.stack([(mask[r] & (steps[r] == k)).sum() for k in range(n_steps)]).double()
        expected = per_step * mask[r].sum() / (per_step * lengths).sum()  # token mean 1
        for k in range(n_steps):
            in_step = w[r][mask[r] & (steps[r] == k)]
            assert torch.allclose(in_step, expected[k].expand_as(in_step), atol=1e-12), (r, k)


def test_step_with_one_step_or_nonfinite_scores_is_uniform():
    ids = torch.tensor([[1, 2, 3, 4], [1, 0, 2, 3]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    steps = step_ids(ids, mask, torch.tensor([0]))
    scores = torch.tensor([[0.0, 5.0, 1.0, 2.0], [1.0, float("nan"), 2.0, 3.0]], dtype=torch.float64)
    assert torch.all(step_weights(scores, mask, steps) == 1)


# --- one dispatch, one home --------------------------------------------------------------------------------------


def test_rule_weights_dispatches_and_names_what_is_missing():
    scores, mask = _rows([0.0, 1.0, 3.0])
    assert torch.equal(rule_weights("bilevel", scores, mask), bilevel_weights(scores, mask))
    assert set(RULES) == {"bilevel", "sign", "process", "step"}
    with pytest.raises(ValueError, match="rule must be one of 'bilevel', 'sign', 'process', 'step', got 'flat'"):
        rule_weights("flat", scores, mask)
    with pytest.raises(ValueError, match=r"rule 'sign' needs advantages \(CreditBatch.advantages"):
        rule_weights("sign", scores, mask)
    with pytest.raises(ValueError, match="rule 'step' needs steps"):
        rule_weights("step", scores, mask)
    with pytest.raises(ValueError, match="sign_eps must be in"):
        rule_weights("sign", scores, mask, advantages=torch.ones(1, dtype=torch.float64), sign_eps=1.5)
    with pytest.raises(ValueError, match=r"need boundary_ids \(the step-ending token ids\) or a tokenizer"):
        step_ends()


# --- the rule option of every importance credit ----------------------------------------------------------------


def test_every_importance_credit_takes_the_rule_option_and_nothing_else_does():
    for name in IMPORTANCE_CREDITS:
        m = get_credit(name)
        assert m.options["rule"] == ("process" if name == "oracle-process" else "bilevel"), name
        assert {"sign_tau", "sign_eta", "sign_eps", "separator", "boundary_ids"} <= set(m.options), name
        for rule in RULES:
            assert CreditSpec.parse(f"{name}@rule={rule}").resolve().options["rule"] == rule
    for name in set(credit_names()) - set(IMPORTANCE_CREDITS):
        assert "rule" not in get_credit(name).options, name
    with pytest.raises(ValueError, match=r"^credit 'gtpo' has no option\(s\) \['rule'\]; its options: alpha1"):
        CreditSpec.parse("gtpo@rule=sign").resolve()
    with pytest.raises(ValueError, match="^credit 'oar-g': rule must be one of 'bilevel', 'sign', 'process', "
                                         "'step', got 'flat'$"):
        CreditSpec.parse("oar-g@rule=flat").resolve()


def test_a_rules_own_parameter_under_another_rule_is_refused():
    with pytest.raises(ValueError, match="^credit 'oar-g': sign_eta is an option of rule 'sign', not of rule "
                                         "'bilevel', got sign_eta=0.5$"):
        CreditSpec.parse("oar-g@sign_eta=0.5").resolve()
    with pytest.raises(ValueError, match="tau is an option of rule 'bilevel' / 'step', not of rule 'sign'"):
        CreditSpec.parse("random@rule=sign&tau=0.5").resolve()
    assert CreditSpec.parse("oar-p@rule=sign&sign_eta=0.5&horizon=2").resolve().options["sign_eta"] == 0.5
    assert CreditSpec.parse("oar-prefix@rule=step&tau=0.5").resolve().options["tau"] == 0.5
    with pytest.raises(ValueError, match="sign_tau must be > 0"):
        CreditSpec.parse("oar-g@rule=sign&sign_tau=0").resolve()


def test_every_entry_point_takes_a_rule(tmp_path):
    from oar.integrations.verl.core import OARVerlConfig
    from oar.lab.compare import credit_columns
    from oar.trainer import OARConfig
    from trainer_setup import grpo_kwargs

    cfg = OARConfig(**grpo_kwargs(str(tmp_path)), credit="oar-g@rule=sign&sign_eps=0.2")
    assert cfg.resolved_credit.options["rule"] == "sign" and cfg.resolved_credit.options["sign_eps"] == 0.2
    with pytest.raises(ValueError, match="rule must be one of"):
        OARConfig(**grpo_kwargs(str(tmp_path)), credit="oar-g@rule=flat")
    columns = credit_columns(("oar-g@rule=sign", "oracle-oar@rule=process", "shuffle:oar-p@rule=step&horizon=2",
                              "random"))
    assert [str(c) for c in columns.values()] == ["oar-g@rule=sign", "oracle-oar@rule=process",
                                                  "shuffle:oar-p@rule=step&horizon=2", "random"]
    assert OARVerlConfig(credit="oar-prefix@rule=process").resolved.options["rule"] == "process"


# --- the rules through token_credit, with the controls ---------------------------------------------------------

PROMPT = "5+3-2+4="
SLIP2 = "5+3=8; ok; 8-2=5; fine; 5+4=9; \\boxed{9}"
RIGHT = "5+3=8; ok; 8-2=6; fine; 6+4=10; \\boxed{10}"


def _lab_batch(completions: list[str], advantages: list[float], tokenizer: bool = True) -> CreditBatch:
    from oar.lab.model import lab_tokenizer

    tok = lab_tokenizer()
    p = tok([PROMPT] * len(completions), return_tensors="pt", padding=True)
    tok.padding_side = "right"
    c = tok([x + tok.eos_token for x in completions], return_tensors="pt", padding=True)
    return CreditBatch(p.input_ids, p.attention_mask, c.input_ids, c.attention_mask,
                       advantages=torch.tensor(advantages), tokenizer=tok if tokenizer else None)


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("control", ["", "shuffle:", "inverted:"])
def test_every_rule_runs_under_every_control(rule, control):
    """``random`` (an importance credit needing no policy) under each rule and control: the weights are the rule's
    on the (reversed) scores, or their within-row permutation; a shuffled row keeps its multiset of weights."""
    from oar.lab.model import lab_tokenizer

    batch = _lab_batch([SLIP2, RIGHT, SLIP2], [-1.0, 1.0, 0.5])
    probe = OutcomeProbe(lab_tokenizer(), conclude=oar.lab.task.BOXED)
    credit = f"{control}random@rule={rule}"
    base = token_credit(f"random@rule={rule}", batch, probe=probe, generator=torch.Generator().manual_seed(3))
    tc = token_credit(credit, batch, probe=probe, generator=torch.Generator().manual_seed(3))
    assert torch.equal(tc.scores, base.scores) and tc.mask.any()
    ends = step_ends(boundary_ids=None, tokenizer=batch.tokenizer)
    steps = step_ids(batch.completion_ids, base.mask, ends)
    scores = base.scores if control != "inverted:" else reverse_ranks(base.scores, base.mask, "row")
    expected = rule_weights(rule, scores, base.mask, advantages=batch.advantages, steps=steps)
    expected = torch.where(base.mask, expected, torch.ones_like(expected))
    if control == "shuffle:":
        for r in range(3):
            m = base.mask[r]
            assert torch.equal(tc.weights[r][m].sort().values, expected[r][m].float().sort().values)
    else:
        assert torch.allclose(tc.weights, expected.float(), atol=1e-6)
    if rule != "process":
        assert torch.allclose(_masked_mean(tc.weights, tc.mask), torch.ones(3), atol=1e-5)


def test_oracles_are_perfect_importance_under_any_rule():
    batch = _lab_batch([SLIP2, RIGHT], [-1.0, 1.0])
    default = token_credit("oracle-process", batch)
    assert torch.equal(default.weights, torch.where(default.mask, flagged_only(blame_scores(batch), default.mask), 1.0))
    assert torch.equal(token_credit("oracle-process@rule=process", batch).weights, default.weights)
    # without a tokenizer the oracles read the character lab's texts, as their scores do
    assert torch.equal(token_credit("oracle-process", _lab_batch([SLIP2, RIGHT], [-1.0, 1.0], False)).weights,
                       default.weights)
    step = token_credit("oracle-process@rule=step", batch)
    n = int(batch.completion_mask[0].sum())
    start = SLIP2.index("8-2=5")
    assert step.weights[0, :n].mean().item() == pytest.approx(1.0)
    assert step.weights[0, start + 2] > 1 > step.weights[0, 0], "the blamed steps carry the mass"
    assert torch.all(step.weights[1] == 1), "a success has no blame: uniform"
    from oar.lab.model import lab_tokenizer

    probe = OutcomeProbe(lab_tokenizer(), conclude=oar.lab.task.BOXED)
    oar_default = token_credit("oracle-oar", batch, probe=probe)
    assert torch.equal(oar_default.weights, bilevel_weights(oar_default.scores, oar_default.mask).float())
    sign = token_credit("oracle-oar@rule=sign", batch, probe=probe)
    m = sign.mask
    assert torch.all((sign.weights[m] >= 1 - SIGN_EPS - 1e-6) & (sign.weights[m] <= 1 + SIGN_EPS + 1e-6))
    digits = sign.scores > 0.5
    assert torch.all(sign.weights[0][digits[0]] < 1) and torch.all(sign.weights[1][digits[1]] > 1)
    assert math.isclose(float(_masked_mean(sign.weights, m)[0]), 1.0, abs_tol=1e-6)


def test_a_rule_that_needs_the_outcome_says_so():
    from oar.lab.model import lab_tokenizer

    batch = _lab_batch([SLIP2], [-1.0])
    bare = CreditBatch(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    probe = OutcomeProbe(lab_tokenizer(), conclude=oar.lab.task.BOXED)
    with pytest.raises(ValueError, match=r"rule 'sign' needs advantages \(CreditBatch.advantages"):
        token_credit("random@rule=sign", bare, probe=probe)
    assert torch.equal(token_credit("random", bare, probe=probe, generator=torch.Generator().manual_seed(0)).weights,
                       token_credit("random", batch, probe=probe, generator=torch.Generator().manual_seed(0)).weights)


def test_a_finished_run_recorded_before_the_rule_option_still_counts_on_resume(tmp_path):
    """Runs an older oar recorded (credit defaults without ``rule`` and its parameters) ran today's default rule:
    ``--resume`` counts them; a changed default of a recorded option still does not count."""
    import json
    from dataclasses import asdict

    from oar.lab.compare import finished_run
    from oar.lab.run import RunConfig, credit_defaults

    cfg = RunConfig(credit="oar-prefix", budget_s=30.0, eval_every=10)
    final = {"step": 3, "wall_time": 31.0, "eval/accuracy": 0.5}
    before = {"separator": "\\n|;", "boundary_ids": None, "chunk_size": 64, "tau": 0.25, "beta": 1.0, "floor": 0.1}
    assert set(before) < set(credit_defaults(cfg))
    for name, recorded in (("older", before), ("changed", {**before, "tau": 0.3})):
        d = tmp_path / name
        d.mkdir()
        (d / "run.json").write_text(json.dumps({"lab": asdict(cfg), "credit_defaults": recorded}))
        (d / "metrics.jsonl").write_text(json.dumps(final) + "\n")
        (d / "summary.json").write_text(json.dumps({"final": final}))
    assert finished_run(tmp_path / "older", cfg) and not finished_run(tmp_path / "changed", cfg)


def test_oar_credits_lists_the_rules_and_the_docs_hold_the_table(capsys):
    from pathlib import Path

    from oar.cli import main
    from oar.credit import rule_table

    assert main(["credits"]) == 0
    out = capsys.readouterr().out
    for rule in RULES:
        assert f"| `{rule}` |" in out
    assert "TASPO, arXiv 2608.31077" in out and rule_table() in out
    page = (Path(__file__).parent.parent / "docs" / "credits.md").read_text(encoding="utf-8")
    assert rule_table() in page, "docs/credits.md: paste the rules table `oar credits` prints"


def test_oar_attribute_takes_a_rule_and_needs_rewards_for_the_signed_ones(char_tokenizer, tiny_qwen2):
    from oar.attribution import attribute_batch

    prompts = ["2+2?"] * 2
    completions = ["2+2=4;4+0=4 \\boxed{4}", "2+2=5;5+0=5 \\boxed{5}"]
    with pytest.raises(ValueError, match="rule 'process' reads the sign of each completion's advantage: pass one "
                                         "reward per completion"):
        attribute_batch(tiny_qwen2, char_tokenizer, prompts, completions, "oar-g@rule=process")
    recs = attribute_batch(tiny_qwen2, char_tokenizer, prompts, completions, "oar-g@rule=process", rewards=[1, 0])
    assert all(w == 1 for w in recs[0].weights), "the success keeps weight 1"
    fail = recs[1]
    ids = torch.tensor([char_tokenizer(completions[1])["input_ids"]])
    mask = torch.tensor([fail.reasoning])
    steps = step_ids(ids, mask, step_ends(tokenizer=char_tokenizer))
    expected = process_weights(torch.tensor([fail.scores]), mask, torch.tensor([-1.0]), steps)
    assert fail.weights == expected[0].tolist(), "the failure: 0 before its decisive step, 1 from it"
    steps = attribute_batch(tiny_qwen2, char_tokenizer, prompts, completions, "oar-g@rule=step")
    reasoning = [w for w, m in zip(steps[0].weights, steps[0].reasoning, strict=True) if m]
    assert len(set(reasoning[:4])) == 1 and len(set(reasoning)) <= 2, "one weight per step (2+2=4; | 4+0=4)"


@pytest.mark.parametrize("rule", list(RULES))
def test_the_verl_fold_applies_every_rule_as_token_credit_does(rule, char_tokenizer, tiny_qwen2):
    """verl: the actors score and mark the step ends, the driver (no tokenizer) folds: the same token advantages as
    token_credit on the whole batch, for every rule (the sign read off verl's [B, T] GRPO advantages)."""
    from oar.integrations.verl.core import OARVerlConfig, fold_credit, score_shard, step_end_tokens
    from oar.probe import rollout_tensors

    tok = char_tokenizer
    texts = ["3+4=7;7+1=8; \\boxed{8}", "3+4=8;8+1=9; \\boxed{9}", "so 3+4=7; \\boxed{7}", "3+4=7\n7+1=8 \\boxed{8}"]
    p = [tok("3+4+1=", add_special_tokens=False)["input_ids"]] * len(texts)
    prompt_ids, prompt_mask, response_ids, response_mask = rollout_tensors(
        p, [tok(t, add_special_tokens=False)["input_ids"] for t in texts])
    adv_seq = torch.tensor([0.8, -1.2, 0.4, -0.3])
    active = adv_seq != 0
    cfg = OARVerlConfig(credit=f"random@rule={rule}", batch_size=8)
    seed = 1  # random scores under which process zeroes a prefix (seed 0 puts both failures' top token first)
    scores, mask = score_shard(cfg, tiny_qwen2, tok, prompt_ids, prompt_mask, response_ids, response_mask, active,
                               torch.Generator().manual_seed(seed))
    ends = step_end_tokens(cfg, tok, response_ids, response_mask)
    assert ends.any() == (rule in ("step", "process"))
    grpo = adv_seq[:, None] * response_mask
    folded, _ = fold_credit(cfg, grpo, response_mask, scores, mask, active, ends=ends)
    want = token_credit(f"random@rule={rule}", CreditBatch(prompt_ids, prompt_mask, response_ids, response_mask,
                                                           adv_seq, tokenizer=tok),
                        active=active, probe=OutcomeProbe(tok), batch_size=8,
                        generator=torch.Generator().manual_seed(seed))
    assert want.mask.any() and not torch.all(want.weights == 1)
    torch.testing.assert_close(folded, want.advantages(adv_seq) * response_mask)
    if rule in ("step", "process"):
        with pytest.raises(ValueError, match=f"rule '{rule}' groups by steps: pass ends"):
            fold_credit(cfg, grpo, response_mask, scores, mask, active)


# these completions ("3+4 is 7, \boxed{7}") have no newline or ';': a step ends at a space
@pytest.mark.parametrize("credit", ["oar-g@rule=sign", "random@rule=process&separator=\\s",
                                    "oar-prefix@rule=step&separator=\\s", "shuffle:entropy@rule=step&separator=\\s",
                                    "sc-grpo", "grail@symmetry=both"])
def test_the_trainer_trains_every_rule_and_the_new_peers(tmp_path, char_tokenizer, credit):
    """`oar train --credit NAME@rule=R` parses, and one GRPO step runs with it: the trainer hands the credit the
    advantages and its tokenizer, and the scored rows' token advantages vary."""
    import datasets

    from oar.train_run import parse_train_args
    from oar.trainer import OARConfig, OARGRPOTrainer
    from trainer_setup import first_group_reward, grpo_kwargs, task_rows, warm_tiny_lm

    _, parsed = parse_train_args(["--model", "x", "--output_dir", str(tmp_path), "--credit", credit])
    assert parsed.credit == str(CreditSpec.parse(credit))
    seen = []

    class Recording(OARGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            seen.append(out["advantages"].clone())
            return out

    args = grpo_kwargs(str(tmp_path), max_steps=1)
    rewards = first_group_reward
    if credit.startswith(("sc-grpo", "grail")):  # a verified solution and a boxed answer in the first group
        def rewards(prompts, completions, **kw):
            return [float(i in (0, 1)) for i in range(len(completions))]
    rows = datasets.Dataset.from_list(task_rows(32, seed=3))
    trainer = Recording(model=warm_tiny_lm(char_tokenizer), reward_funcs=rewards,
                        args=OARConfig(**args, credit=credit), train_dataset=rows, processing_class=char_tokenizer)
    trainer.train()
    (adv,) = seen
    active = (adv != 0).any(dim=1)
    assert torch.isfinite(adv).all() and active.any()
    assert adv[active].std(dim=1).max() > 0, f"{credit}: a scored row's token advantages vary"


def test_the_controls_of_oracle_process_under_its_default_rule():
    """shuffle: the old weights permuted, as before; inverted: the reversed blame peaks at the first token, so the
    process rule zeroes nothing (documented change: before the rules it gave the reversed flags)."""
    batch = _lab_batch([SLIP2], [-1.0])
    base = token_credit("oracle-process", batch)
    from oar.credit import shuffle_within_rows

    shuf = token_credit("shuffle:oracle-process", batch, generator=torch.Generator().manual_seed(0)).weights
    old = torch.where(base.mask, flagged_only(blame_scores(batch), base.mask), 1.0)
    assert torch.equal(shuf, shuffle_within_rows(old, base.mask, torch.Generator().manual_seed(0)))
    assert not torch.equal(shuf, base.weights)
    assert torch.all(token_credit("inverted:oracle-process", batch).weights == 1)
