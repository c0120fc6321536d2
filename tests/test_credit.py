"""oar.credit: the registry, token_credit, the controls, and each peer method against a hand-computed example."""

from __future__ import annotations

import json
import math

import pytest
import torch

from oar.credit import (
    CreditBatch,
    CreditSpec,
    credit_names,
    get_credit,
    register_credit,
    reverse_ranks,
    shuffle_within_rows,
    token_credit,
    unregister_credit,
)
from oar.credit.peers.cf_span import cf_span_weights, cf_spans
from oar.credit.peers.entropy_mask import high_entropy_mask
from oar.credit.peers.gtpo import gtpo_advantages
from oar.credit.peers.ktae import fisher_exact_p, key_token_values
from oar.probe import OutcomeProbe
from oar.reshape import bilevel_weights

# --- registry -----------------------------------------------------------------------------------------------


def test_registry_lists_builtins_and_names_unknown_ones():
    names = credit_names()
    for n in ("grpo", "oar-g", "oar-p", "entropy", "random", "entropy-mask", "gtpo", "ktae", "cf-span"):
        assert n in names
    with pytest.raises(ValueError, match=r"unknown credit 'nope'; registered: grpo, oar-g, oar-p"):
        get_credit("nope")
    with pytest.raises(ValueError, match="unknown credit control 'flip'"):
        get_credit("flip:oar-g")
    with pytest.raises(ValueError, match="'grpo' leaves every advantage as it is"):
        get_credit("shuffle:grpo")
    assert get_credit("OAR-G").name == "oar-g"
    m = get_credit("shuffle:oar-g")
    assert (m.name, m.control, m.base, m.combine) == ("shuffle:oar-g", "shuffle", "oar-g", "multiply")
    assert m.options == get_credit("oar-g").options


def test_every_method_declares_what_the_docs_table_needs():
    for name in credit_names():
        m = get_credit(name)
        assert m.paper and m.summary and m.passes, name
        assert m.combine in ("multiply", "mask", "add", "replace")


def test_register_rejects_duplicates_stray_options_and_bad_names():
    with pytest.raises(ValueError, match="already registered"):
        register_credit("oar-g", combine="multiply", needs_policy=False, needs_probe=False, passes="0",
                        paper="x", summary="x")(lambda batch: batch.completion_ids.float())
    with pytest.raises(ValueError, match=r"declares options \['gamma'\]"):
        register_credit("t-stray", combine="multiply", needs_policy=False, needs_probe=False, passes="0",
                        paper="x", summary="x", options={"gamma": 1})(lambda batch: batch.completion_ids.float())
    with pytest.raises(ValueError, match="no ':'"):
        register_credit("a:b", combine="add", needs_policy=False, needs_probe=False, passes="0", paper="x",
                        summary="x")
    with pytest.raises(ValueError, match="combine must be one of"):
        register_credit("t-bad", combine="sum", needs_policy=False, needs_probe=False, passes="0", paper="x",
                        summary="x")
    with pytest.raises(ValueError, match=r"credit 'oar-g' has no option\(s\) \['rho'\]"):
        get_credit("oar-g").check_options({"rho": 0.2})


# --- controls -----------------------------------------------------------------------------------------------


def test_shuffle_permutes_masked_entries_within_each_row_only():
    g = torch.Generator().manual_seed(0)
    values = torch.arange(40, dtype=torch.float32).view(4, 10)
    mask = torch.rand(4, 10, generator=g) > 0.4
    out = shuffle_within_rows(values, mask, torch.Generator().manual_seed(1))
    assert torch.equal(out[~mask], values[~mask])
    for b in range(4):
        assert sorted(out[b][mask[b]].tolist()) == sorted(values[b][mask[b]].tolist())
    assert not torch.equal(out, values), "a shuffle of 20+ entries left everything in place"


def test_reverse_ranks_reverses_order_over_the_scope():
    s = torch.tensor([[0.1, 0.5, 0.3, 9.0], [2.0, 1.0, 4.0, 0.0]])
    m = torch.tensor([[True, True, True, False], [True, True, True, True]])
    row = reverse_ranks(s, m, "row")
    assert torch.allclose(row[0, :3], torch.tensor([0.5, 0.1, 0.3])) and row[0, 3] == 9.0
    assert torch.argsort(row[1]).tolist() == torch.argsort(s[1], descending=True).tolist()
    assert torch.equal(reverse_ranks(s, m, "negate")[m], -s[m])
    batch = reverse_ranks(s, m, "batch")
    assert torch.allclose(batch[m], 4.0 - s[m])  # max 4.0 + min 0.0 over the masked entries


# --- token_credit on a tiny model ------------------------------------------------------------------------------

PROMPTS = ["2+3*4?", "7-1?", "9+9?"]
COMPLETIONS = ["2+3=5;5*4=20\nso \\boxed{20}", "7-1=6, so 7-1 gives \\boxed{6}", "9+9 is eighteen"]


def _batch(tok, model, rewards=None, group=None):
    from oar.attribution import _encode
    from oar.probe import rollout_tensors

    rollout = rollout_tensors([_encode(tok, p, False, True) for p in PROMPTS],
                              [_encode(tok, c, False, False) for c in COMPLETIONS], tok.pad_token_id)
    return CreditBatch(*rollout, rewards=rewards, group=group, model=model)


def test_token_credit_oar_p_is_bilevel_of_the_probe_scores(char_tokenizer, tiny_qwen2):
    from oar.importance import perturbation_scores

    probe = OutcomeProbe(char_tokenizer)
    batch = _batch(char_tokenizer, tiny_qwen2)
    tc = token_credit("oar-p", batch, probe=probe, batch_size=2, options={"tau": 0.3})
    pb = probe(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    raw = pb.to_completion(perturbation_scores(tiny_qwen2, pb.input_ids, pb.attention_mask, pb.reasoning_mask,
                                               pb.answer_mask))
    mask = pb.completion_reasoning_mask & pb.valid[:, None]
    assert torch.equal(tc.mask, mask) and torch.equal(tc.answer_mask, pb.completion_statement_mask)
    assert torch.allclose(tc.scores, raw.masked_fill(~mask, 0), atol=1e-6)
    assert torch.allclose(tc.weights, bilevel_weights(tc.scores, mask, tau=0.3), atol=1e-6)
    assert torch.equal(tc.offsets, torch.zeros_like(tc.offsets))
    assert tc.flags["no_answer"].tolist() == [False, False, True]
    A = torch.tensor([1.0, -2.0, 0.5])
    assert torch.allclose(tc.advantages(A), A[:, None] * tc.weights)
    # inactive rows are neither scored nor reshaped
    part = token_credit("oar-p", batch, probe=probe, active=torch.tensor([False, True, True]))
    assert not part.mask[0].any() and torch.equal(part.weights[0], torch.ones_like(part.weights[0]))
    assert torch.allclose(part.weights[1], bilevel_weights(tc.scores, mask)[1], atol=1e-6)


def test_controls_keep_the_weight_distribution_but_not_the_positions(char_tokenizer, tiny_qwen2):
    probe = OutcomeProbe(char_tokenizer)
    batch = _batch(char_tokenizer, tiny_qwen2)
    base = token_credit("oar-p", batch, probe=probe)
    shuf = token_credit("shuffle:oar-p", batch, probe=probe, generator=torch.Generator().manual_seed(0))
    inv = token_credit("inverted:oar-p", batch, probe=probe)
    assert torch.equal(shuf.scores, base.scores) and torch.equal(shuf.mask, base.mask)
    for b in range(2):
        m = base.mask[b]
        assert torch.allclose(shuf.weights[b][m].sort().values, base.weights[b][m].sort().values)
        assert not torch.allclose(shuf.weights[b][m], base.weights[b][m])
        assert inv.weights[b][m].mean().item() == pytest.approx(1.0, abs=1e-5)
        top, bottom = base.scores[b][m].argmax(), base.scores[b][m].argmin()
        assert inv.weights[b][m][top] == inv.weights[b][m].min(), "inverted: the top-scored token is suppressed"
        assert inv.weights[b][m][bottom] == inv.weights[b][m].max()


def test_a_method_registered_in_user_code_runs_through_token_credit(char_tokenizer, tiny_qwen2):
    @register_credit("t-last-token", combine="multiply", needs_policy=False, needs_probe=False, passes="0",
                     paper="test", summary="boost the last completion token", options={"boost": 3.0},
                     effect=lambda scores, mask, boost=3.0: 1 + (boost - 1) * scores)
    def last_token(batch):
        n = batch.completion_mask.sum(dim=1)
        return torch.nn.functional.one_hot(n - 1, batch.completion_ids.shape[1]).float()

    try:
        tc = token_credit("t-last-token", _batch(char_tokenizer, tiny_qwen2), options={"boost": 5.0})
        n = _batch(char_tokenizer, tiny_qwen2).completion_mask.sum(dim=1)
        assert tc.weights[0, n[0] - 1] == 5.0 and tc.weights[0, 0] == 1.0
        assert "t-last-token" in credit_names()
        with pytest.raises(ValueError, match="no option"):
            token_credit("t-last-token", _batch(char_tokenizer, tiny_qwen2), options={"bost": 5.0})
    finally:
        unregister_credit("t-last-token")
    assert "t-last-token" not in credit_names()


def test_requirements_are_checked_before_work(char_tokenizer, tiny_qwen2):
    batch = _batch(char_tokenizer, None)
    with pytest.raises(ValueError, match="needs the policy"):
        token_credit("oar-g", batch, probe=OutcomeProbe(char_tokenizer))
    with pytest.raises(ValueError, match="needs an outcome probe"):
        token_credit("oar-g", _batch(char_tokenizer, tiny_qwen2))
    with pytest.raises(ValueError, match="needs the rollout group"):
        token_credit("ktae", batch)


# --- peer methods against hand-computed examples (docs/credits.md) ---------------------------------------------


def test_entropy_mask_keeps_the_top_rho_by_interpolated_quantile():
    H = torch.tensor([[0.1, 2.0, 0.3, 0.05], [1.5, 0.2, 0.4, 0.0]])
    m = torch.tensor([[True] * 4, [True, True, True, False]])
    # 7 tokens; quantile(0.8) = 0.4 + 0.8 * (1.5 - 0.4) = 1.28 -> keeps 2.0 and 1.5
    assert high_entropy_mask(H, m, 0.2).tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]
    ties = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]])
    assert high_entropy_mask(ties, torch.ones_like(ties, dtype=torch.bool), 0.2).sum() == 3  # TRL's rule keeps ties
    with pytest.raises(ValueError, match="rho"):
        high_entropy_mask(H, m, 0.0)


def test_gtpo_matches_the_hand_computed_example():
    H = torch.tensor([[1.0, 0.5, 2.0], [1.0, 1.5, 0.0], [0.5, 1.0, 0.25], [2.0, 1.0, 0.0]])
    m = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]]).bool()
    ok, g = torch.tensor([True, True, False, False]), torch.zeros(4, dtype=torch.long)
    joint = gtpo_advantages(H, m, ok, g, eps=1e-12)
    want = torch.tensor([[0.9995, 0.9541, 0.9995], [0.9995, 1.0449, 0], [-1.0540, -0.9995, -0.9995],
                         [-0.9450, -0.9995, 0]])
    assert torch.allclose(joint, want, atol=1e-4)
    sep = gtpo_advantages(H, m, ok, g, norm="separate", eps=1e-12)
    want = torch.tensor([[0, -1.5811, 0], [0, 1.5811, 0], [-1.5811, 0, 0], [1.5811, 0, 0]])
    assert torch.allclose(sep, want, atol=1e-4)
    # two groups are normalised independently: a copy of the group in a second group changes nothing
    two = gtpo_advantages(torch.cat([H, H]), torch.cat([m, m]), torch.cat([ok, ok]),
                          torch.tensor([0, 0, 0, 0, 5, 5, 5, 5]), eps=1e-12)
    assert torch.allclose(two, torch.cat([joint, joint]), atol=1e-6)


def test_ktae_matches_the_hand_computed_example():
    ids = torch.tensor([[5, 7, 7, 3], [5, 7, 8, 3], [5, 7, 8, 8], [5, 6, 8, 9]])
    ok = torch.tensor([True, True, False, False])
    key = key_token_values(ids, torch.ones(4, 4, dtype=torch.bool), ok)
    k7 = 0.236440
    want = torch.tensor([[0, k7, k7, 1.0], [0, k7, -k7, 1.0], [0, k7, -k7, -k7], [0, -1.0, -k7, -1.0]])
    assert torch.allclose(key, want, atol=1e-4)
    assert torch.equal(key_token_values(ids, torch.ones(4, 4, dtype=torch.bool), torch.ones(4).bool()),
                       torch.zeros(4, 4)), "a group without both outcomes has no key tokens"
    # Fisher exact: [[2, 0], [0, 2]] has p = 1/3; [[3, 1], [1, 3]] has p = 0.4857 (scipy)
    p = fisher_exact_p(torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0]),
                       torch.tensor([2.0, 3.0]))
    assert torch.allclose(p, torch.tensor([1 / 3, 0.4857142857], dtype=torch.float64), atol=1e-8)


def test_ktae_credit_adds_the_key_to_the_grpo_advantage():
    ids = torch.tensor([[5, 7, 7, 3], [5, 7, 8, 3], [5, 7, 8, 8], [5, 6, 8, 9]])
    batch = CreditBatch(torch.zeros(4, 1, dtype=torch.long), torch.ones(4, 1), ids, torch.ones(4, 4),
                        rewards=torch.tensor([1.0, 1.0, 0.0, 0.0]), group=torch.zeros(4, dtype=torch.long))
    A = torch.tensor([1, 1, -1, -1]) * 0.5 / math.sqrt(1 / 3)
    tc = token_credit("ktae", batch)
    got = tc.advantages(A)
    assert got[0].tolist() == pytest.approx([0.866024, 1.102464, 1.102464, 1.866024], abs=1e-4)
    assert got[3].tolist() == pytest.approx([-0.866024, -1.866024, -1.102464, -1.866024], abs=1e-4)


def test_cf_span_weights_match_the_hand_computed_example():
    m = torch.ones(1, 10, dtype=torch.bool)
    assert cf_spans(m).tolist() == [[0] * 5 + [1] * 5]
    drop = torch.tensor([[math.log(0.6 / 0.62)] * 5 + [math.log(0.6 / 0.15)] * 5])
    w = cf_span_weights(drop, m)
    assert w[0, :5].tolist() == pytest.approx([0.914894] * 5, abs=1e-5)
    assert w[0, 5:].tolist() == pytest.approx([2.914894] * 5, abs=1e-5)
    assert cf_span_weights(drop * 40, m).min() == 0.5 and cf_span_weights(-drop * 40, m).max() <= 4.0
    assert cf_span_weights(drop, m, renormalize=True).mean().item() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("n", [2, 12, 49, 400, 501, 2000])
def test_cf_spans_probe_at_most_ten_windows_of_5_to_50_tokens(n):
    m = torch.zeros(1, n + 3, dtype=torch.bool)
    m[0, 3 : 3 + n] = True
    s = cf_spans(m)[0]
    ids = s[s >= 0].unique()
    assert 1 <= ids.numel() <= 10
    lengths = torch.stack([(s == i).sum() for i in ids])
    assert lengths.max() <= 50 and (lengths[:-1] >= min(5, n)).all()
    assert (s[~m[0]] == -1).all()


def test_docs_method_table_is_the_registry():
    from pathlib import Path

    import oar.lab  # noqa: F401  (`oar credits` lists the lab's oracles too)
    from oar.credit import credit_table

    page = (Path(__file__).parent.parent / "docs" / "credits.md").read_text(encoding="utf-8")
    assert credit_table() in page, "docs/credits.md: paste the output of `oar credits` into the method table"


def test_oar_credits_command_lists_every_method_with_its_cost():
    """The command itself, in a fresh interpreter (nothing imported beforehand): the lab's oracles are listed (the
    command imports the lab), and vine's and oar-prefix's rows carry their extra passes."""
    import re
    import subprocess
    import sys

    command = "import sys; from oar.cli import main; sys.exit(main(['credits']))"
    out = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    cells = [re.split(r"(?<!\\)\|", line) for line in out.splitlines() if line.startswith("| `")]  # \| is text
    rows = {c[1].strip().strip("`"): c for c in cells}
    assert {"grpo", "oar-g", "oar-p", "oar-prefix", "vine", "vine-w", "oracle-blame", "oracle-process",
            "oracle-oar"} <= set(rows)
    assert "K continuations (generation)" in rows["vine"][5] and "K continuations" in rows["vine-w"][5]
    assert "per step boundary" in rows["oar-prefix"][5] and rows["oracle-process"][5].strip() == "0 (lab ground truth)"


# --- typed options ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "credit, options, message",
    [("oar-p", {"chunk_size": 0}, "chunk_size must be >= 1, got 0"),
     ("oar-p", {"chunk_size": 2.5}, "chunk_size must be an integer, got 2.5"),
     ("oar-p", {"span": 0}, "span must be >= 1"),
     ("oar-p", {"horizon": -1}, "horizon must be >= 0"),
     ("oar-p", {"mode": "mean"}, "mode must be one of 'last', 'answer_mean', 'answer_joint', got 'mean'"),
     ("oar-g", {"noise_std": -1.0}, "noise_std must be >= 0"),
     ("oar-g", {"tau": True}, "tau must be a number, got True"),
     ("oar-g", {"beta": float("nan")}, "beta must be a finite number, got nan"),
     ("gtpo", {"alpha1": float("nan")}, "alpha1 must be a finite number, got nan"),
     ("gtpo", {"alpha2": float("-inf")}, "alpha2 must be a finite number, got -inf"),
     ("vine", {"separator": "("}, "separator must be a regular expression"),
     ("oar-prefix", {"separator": "[a"}, "separator must be a regular expression"),
     ("oar-pg", {"k": 0}, "k must be in (0, 1]"),
     ("oar-pg", {"calibration": "mean"}, "calibration must be one of 'median', 'below'"),
     ("entropy-mask", {"rho": 1.5}, "rho must be in (0, 1], got 1.5"),
     ("entropy-mask", {"temperature": 0}, "temperature must be > 0"),
     ("gtpo", {"norm": "z"}, "norm must be one of 'joint', 'separate'"),
     ("ktae", {"top": -1}, "top must be >= 0"),
     ("cf-span", {"renormalize": "yes"}, "renormalize must be true or false")],
)
def test_each_declared_option_refuses_a_bad_value(credit, options, message):
    with pytest.raises(ValueError, match=f"^credit '{credit}': ") as err:
        get_credit(credit).check_options(options)
    assert message in str(err.value)
    with pytest.raises(ValueError, match="must be"):  # the credit value is checked by the same declaration
        CreditSpec(credit, options).resolve()
    with pytest.raises(ValueError, match="must be"):  # written as text too (NaN and Infinity as JSON writes them)
        CreditSpec.parse(f"{credit}@" + "&".join(f"{k}={json.dumps(v)}" for k, v in options.items())).resolve()


def test_declared_options_accept_their_defaults_ints_for_floats_and_null_where_allowed():
    for name in credit_names():
        m = get_credit(name)
        assert m.check_options(dict(m.options)) == dict(m.options), name
    assert get_credit("oar-g").check_options({"beta": 2, "noise_std": None})["beta"] == 2
    assert get_credit("oar-p").check_options({"horizon": None, "span": 3})["span"] == 3
    assert get_credit("shuffle:oar-g").check_options({"tau": 0.5})["tau"] == 0.5  # a control keeps the declarations
    with pytest.raises(ValueError, match="credit 'shuffle:oar-g': tau must be in"):
        get_credit("shuffle:oar-g").check_options({"tau": 0})
    with pytest.raises(ValueError, match="must be an integer or null"):
        get_credit("oar-p").check_options({"replace_id": "pad"})


def test_a_declaration_must_accept_its_own_default_and_plain_defaults_accept_anything():
    from oar.credit.options import Option

    with pytest.raises(ValueError, match="default of k must be >= 1, got 0"):
        register_credit("t-bad-default", combine="multiply", needs_policy=False, needs_probe=False, passes="0",
                        paper="t", summary="t", options={"k": Option(0, int, ">= 1")},
                        effect=lambda scores, mask, k=0: scores)(lambda batch: batch.completion_mask.float())
    assert "t-bad-default" not in credit_names()

    @register_credit("t-plain", combine="multiply", needs_policy=False, needs_probe=False, passes="0", paper="t",
                     summary="t", options={"k": 3}, effect=lambda scores, mask: 1 + scores)
    def plain(batch, k=3):
        return batch.completion_mask.float()

    try:
        assert get_credit("t-plain").check_options({"k": "anything"}) == {"k": "anything"}
    finally:
        unregister_credit("t-plain")


def test_ranges_are_parsed_from_their_text():
    from oar.ranges import check_range, in_range

    assert in_range(0.5, "in (0, 1)") and not in_range(0, "in (0, 1)") and in_range(0, "in [0, 1]")
    assert in_range(1, "in (0, 1]") and not in_range(1, "in [0, 1)") and in_range(2, "> 1") and not in_range(1, "> 1")
    assert in_range(-1, "<= -1") and not in_range(float("inf"), ">= 0") and not in_range(True, ">= 0")
    with pytest.raises(ValueError, match="malformed range"):
        in_range(1, "between 0 and 1")
    with pytest.raises(ValueError, match=r"^x must be >= 1, got 0$"):
        check_range("x", 0, ">= 1")


# --- one credit value: CreditSpec ----------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_KEYS = st.text(st.characters(codec="utf-8", exclude_characters="&=@\x00"), min_size=1, max_size=8).filter(
    lambda k: k.strip() == k)
_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False)
                       | st.text(max_size=12), lambda inner: st.lists(inner, max_size=3), max_leaves=5)


@settings(max_examples=200, deadline=None)
@given(options=st.dictionaries(_KEYS, _VALUES, max_size=4))
def test_credit_spec_format_is_the_inverse_of_parse(options):
    """Any options (text with '&', spaces, quotes, text that reads as a number; lists; null) survive the text."""
    spec = CreditSpec("oar-p", options)
    again = CreditSpec.parse(str(spec))
    assert again == spec and dict(again.options) == options and list(again.options) == list(options)


def test_credit_spec_reads_and_writes_the_column_text():
    spec = CreditSpec.parse(" OAR-P@horizon=2&chunk_size=64&mode=last ")
    assert (spec.name, dict(spec.options)) == ("oar-p", {"horizon": 2, "chunk_size": 64, "mode": "last"})
    assert str(spec) == "oar-p@horizon=2&chunk_size=64&mode=last" and repr(spec) == f"CreditSpec({str(spec)!r})"
    assert CreditSpec.parse("shuffle:oar-g@beta=2").name == "shuffle:oar-g"
    assert str(CreditSpec("vine", {"separator": " |, ", "k": "2"})) == 'vine@separator=" |, "&k="2"'
    assert CreditSpec.parse("oar-g@") == CreditSpec("oar-g")
    assert hash(CreditSpec("oar-g")) == hash(CreditSpec.parse("oar-g"))
    import pickle

    assert pickle.loads(pickle.dumps(spec)) == spec
    with pytest.raises(AttributeError):
        spec.name = "oar-g"  # frozen
    with pytest.raises(TypeError):
        spec.options["horizon"] = 3  # type: ignore[index]
    for bad, message in (("oar-g@beta", "expected OPT=VALUE"), ("@beta=2", "expected NAME"),
                         ("oar-g@beta=1&beta=2", "'beta' is given twice")):
        with pytest.raises(ValueError, match=message):
            CreditSpec.parse(bad)
    with pytest.raises(ValueError, match="sets beta=2, and oar_beta sets beta=3"):
        CreditSpec.parse("oar-g@beta=2").merged({"beta": 3}, "oar_beta")
    assert CreditSpec.parse("oar-g@beta=2").merged({"beta": 2, "tau": 0.5}, "x") == CreditSpec.parse(
        "oar-g@beta=2&tau=0.5")


def test_resolve_checks_the_options_and_the_methods_rules_once():
    method, options = CreditSpec.parse("oar-p@horizon=2").resolve()
    assert method is get_credit("oar-p") and options == {**method.options, "horizon": 2}
    for text, message in (("oar-g@noise_std=0&mode=last", "noise_std must be > 0 unless mode is 'answer_joint'"),
                          ("oar-pg@noise_std=0", "noise_std must be > 0 unless guide_mode is 'answer_joint'"),
                          ("shuffle:oar-g@noise_std=0&mode=answer_mean", "unless mode is 'answer_joint'"),
                          ("gtpo@alpha1=NaN", "alpha1 must be a finite number, got nan"),
                          ("oar-p@horizon=Infinity", "horizon must be an integer or null, got inf")):
        with pytest.raises(ValueError, match=f"^credit '[a-z:-]+': .*{message}"):
            CreditSpec.parse(text).resolve()
    CreditSpec.parse("oar-g@noise_std=0").resolve()  # answer_joint needs no noise
    CreditSpec.parse("oar-pg@noise_std=0&guide_mode=answer_joint").resolve()


def test_an_option_group_attaches_its_options_and_rule_to_every_method_that_lists_it():
    """The next reshaping option reaches every method of a group by one declaration: the group's options and its
    cross-option check are each method's, checked at every entry point; a name declared twice is refused."""
    from oar.credit.options import Option, OptionGroup

    def rule(options):
        if options["lo"] > options["hi"]:
            raise ValueError(f"lo must be <= hi, got lo={options['lo']} hi={options['hi']}")

    group = OptionGroup("clip", {"lo": Option(0.0, float), "hi": Option(1.0, float)}, check=rule)

    def effect(scores, mask, lo=0.0, hi=1.0):
        return scores.clamp(lo, hi)

    names = ("t-clip-a", "t-clip-b")
    try:
        for name in names:
            register_credit(name, combine="multiply", needs_policy=False, needs_probe=False, passes="0", paper="t",
                            summary="t", effect=effect, groups=(group,))(lambda batch: batch.completion_mask.float())
        for name in names:
            assert get_credit(name).options == {"lo": 0.0, "hi": 1.0}
            with pytest.raises(ValueError, match=f"^credit '{name}': lo must be <= hi, got lo=2 hi=1.0"):
                CreditSpec.parse(f"{name}@lo=2").resolve()
            with pytest.raises(ValueError, match="hi must be a finite number"):
                get_credit(f"shuffle:{name}").check_options({"hi": float("inf")})
        with pytest.raises(ValueError, match=r"declares options \['lo'\] twice"):
            register_credit("t-clip-c", combine="multiply", needs_policy=False, needs_probe=False, passes="0",
                            paper="t", summary="t", effect=effect, options={"lo": 0.5}, groups=(group,))(
                lambda batch: batch.completion_mask.float())
    finally:
        for name in names:
            unregister_credit(name)


def test_capabilities_are_declared_at_registration_not_read_off_names():
    """A method that does not act is plain GRPO whatever its name: nothing scored, weights 1, no control of it;
    a rollout need and a lab-only method are fields of the registration (and columns of the docs' table)."""
    assert not get_credit("grpo").acts and all(get_credit(n).acts for n in credit_names() if n != "grpo")
    assert get_credit("vine").needs_rollout and get_credit("vine-w").needs_rollout
    assert not any(get_credit(n).needs_rollout for n in credit_names() if not n.startswith("vine"))
    import oar.lab  # noqa: F401

    assert get_credit("oracle-process").lab_only and not get_credit("oar-g").lab_only

    @register_credit("t-still", combine="multiply", needs_policy=False, needs_probe=False, passes="0", paper="t",
                     summary="t", acts=False, effect=lambda scores, mask: 2 + scores)
    def still(batch):
        raise AssertionError("a method that does not act is never scored")

    try:
        ids = torch.tensor([[5, 6, 7]])
        ones = torch.ones_like(ids)
        tc = token_credit("t-still", CreditBatch(ids, ones, ids, ones, advantages=torch.tensor([1.0])))
        assert torch.equal(tc.weights, torch.ones(1, 3)) and not tc.flags["scored"].any()
        with pytest.raises(ValueError, match="'t-still' leaves every advantage as it is"):
            get_credit("inverted:t-still")
    finally:
        unregister_credit("t-still")


def test_metrics_reduce_each_total_by_name_and_count_too_long_apart():
    from oar.credit.metrics import METRIC_KEYS, TOTALS, gather_totals, metric_totals, metrics_from_totals

    mask = torch.tensor([[True, True, False], [False, False, False]])
    weights = torch.tensor([[0.5, 1.5, 1.0], [1.0, 1.0, 1.0]])
    flags = {"scored": torch.tensor([True, True]), "uniform": torch.tensor([False, True]),
             "too_short": torch.tensor([False, False]), "too_long": torch.tensor([False, True]),
             "nonfinite": torch.tensor([False, False])}
    one = metric_totals(weights, torch.zeros(2, 3), mask, flags)
    assert set(one) == set(TOTALS)
    empty = metric_totals(weights, torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool), flags)
    two = {k: torch.tensor([one[k], empty[k]], dtype=torch.float64) for k in TOTALS}  # two processes
    m = metrics_from_totals(two)
    assert tuple(m) == METRIC_KEYS
    assert (m["oar/frac_too_long"], m["oar/frac_too_short"]) == (0.5, 0.0)  # one too-long row of two, each process
    assert (m["oar/weight_max"], m["oar/weight_min"], m["oar/weight_mean"]) == (1.5, 0.5, 1.0)
    assert metrics_from_totals(gather_totals(one)) == metrics_from_totals(one)
