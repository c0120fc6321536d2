"""Every built-in credit method, registered here in one fixed order (the order of ``credit_names()``,
``oar credits`` and the table in docs/credits.md):

1. plain GRPO and OAR (arXiv 2601.07408): ``grpo``, ``oar-g``, ``oar-p``; our extensions ``oar-pg``, ``oar-prefix``;
2. baselines on OAR's probe and reshaping: ``entropy``, ``random``;
3. peer methods, each from its paper (:mod:`oar.credit.peers`): ``entropy-mask``, ``gtpo``, ``ktae``, ``cf-span``,
   ``vine``, ``vine-w``, ``sc-grpo``, ``grail``.

The score and effect functions live with their method (:mod:`oar.importance`, :mod:`oar.credit.peers`); this
module only states what each needs, costs and cites, and declares each option once, typed, with its range or
choices (:class:`oar.credit.options.Option`; the τ/β/floor defaults and ranges are :mod:`oar.reshape`'s), and
each rule between options (``check=``) and capability (``needs_*``, ``acts``) with the method. Options several
methods share are one :class:`oar.credit.options.OptionGroup`, attached with ``groups=``: ``BILEVEL``, the
reshaping of every importance credit (its ``rule``, :data:`oar.reshape.RULES`, and each rule's parameters).
"""

from __future__ import annotations

import torch

from oar.credit.batch import CreditBatch
from oar.credit.options import Option, OptionCheck, OptionGroup
from oar.credit.peers.cf_span import cf_span_scores, cf_span_weights
from oar.credit.peers.entropy_mask import entropy_mask_scores, high_entropy_mask
from oar.credit.peers.grail import GRAIL_PAPER, SYMMETRIES, grail_scores
from oar.credit.peers.gtpo import NORMS, gtpo_effect, gtpo_scores
from oar.credit.peers.ktae import ktae_scores
from oar.credit.peers.sc_grpo import SC_GRPO_PAPER, sc_grpo_scores, sc_grpo_weights
from oar.credit.peers.vine import PASSES as VINE_PASSES
from oar.credit.peers.vine import SEPARATOR as VINE_SEPARATOR
from oar.credit.peers.vine import VINE_PAPER, replace_effect, vine_scores, weight_effect
from oar.credit.registry import bilevel_effect, register_credit
from oar.importance import entropy_scores, gradient_scores, perturbation_scores, random_scores
from oar.importance._common import MODES
from oar.importance.guided import CALIBRATIONS, guided_perturbation_scores
from oar.importance.prefix import prefix_scores
from oar.reshape import (
    BETA,
    BETA_RANGE,
    FLOOR,
    FLOOR_RANGE,
    RULES,
    SIGN_EPS,
    SIGN_EPS_RANGE,
    SIGN_ETA,
    SIGN_ETA_RANGE,
    SIGN_TAU,
    SIGN_TAU_RANGE,
    TAU,
    TAU_RANGE,
)
from oar.steps import SEPARATOR

OAR_PAPER = "Outcome-Grounded Advantage Reshaping, arXiv 2601.07408"

# the parameters only some rules read (a value other than the default with another rule is refused)
_RULE_PARAMETERS = {"tau": ("bilevel", "step"), "beta": ("bilevel", "step"), "floor": ("bilevel", "step"),
                    "sign_tau": ("sign",), "sign_eta": ("sign",), "sign_eps": ("sign",)}


def _rule_check(options: dict) -> None:
    """A rule's own parameter set away from its default under another rule does nothing: refused, named."""
    for key, rules in _RULE_PARAMETERS.items():
        if options[key] != BILEVEL[key].default and options["rule"] not in rules:
            raise ValueError(f"{key} is an option of rule {' / '.join(map(repr, rules))}, not of rule "
                             f"{options['rule']!r}, got {key}={options[key]!r}")


# The reshaping of every importance credit (bilevel_effect): the rule that turns importance into weights (default
# OAR's Bi-Level, OAR_SPEC §4; oar.reshape.RULES), each rule's parameters, and the step boundaries the step and
# process rules group by (oar-prefix scores across the same steps). One group: an option added here reaches every
# importance credit.
BILEVEL = OptionGroup("bilevel", {
    "rule": Option("bilevel", str, choices=tuple(RULES)),
    "tau": Option(TAU, float, TAU_RANGE), "beta": Option(BETA, float, BETA_RANGE),
    "floor": Option(FLOOR, float, FLOOR_RANGE),
    "sign_tau": Option(SIGN_TAU, float, SIGN_TAU_RANGE), "sign_eta": Option(SIGN_ETA, float, SIGN_ETA_RANGE),
    "sign_eps": Option(SIGN_EPS, float, SIGN_EPS_RANGE),
    "separator": Option(SEPARATOR, str, regex=True), "boundary_ids": Option(None, None),
}, check=_rule_check)


def _mode(default: str) -> Option:
    """The outcome mode of a probe scorer (:data:`oar.importance._common.MODES`)."""
    return Option(default, str, choices=MODES)


def _noise_std(default: float | None) -> Option:
    """OAR-G's embedding noise σ (None: the scorer's default for its mode)."""
    return Option(default, float, ">= 0", nullable=True)


def _noise_rule(mode: str) -> OptionCheck:
    """OAR-G's rule: its KL outcome modes have zero gradient at δ = 0, so they need noise (``mode``: the option
    holding OAR-G's outcome mode)."""
    def check(options: dict) -> None:
        if options["noise_std"] == 0 and options[mode] != "answer_joint":
            raise ValueError(f"noise_std must be > 0 unless {mode} is 'answer_joint' (the KL outcome has zero "
                             f"gradient without noise), got noise_std=0 with {mode}={options[mode]!r}")

    return check


CHUNK_SIZE = Option(16, int, ">= 1")  # perturbed copies per forward pass
REPLACE_ID = Option(None, int, ">= 0")  # the counterfactual token (None: the pad id)
TEMPERATURE = Option(1.0, float, "> 0")  # the policy's entropy is read at this temperature (its own, not GRPO's)


def _uniform_effect(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(scores)


def _identity_effect(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return scores


def grpo_scores(batch: CreditBatch) -> torch.Tensor:
    """``[B, T]`` zeros: plain GRPO has no per-token signal."""
    return torch.zeros(batch.completion_ids.shape, dtype=torch.float32, device=batch.completion_ids.device)


# --- plain GRPO and OAR -------------------------------------------------------------------------------------

register_credit(
    "grpo", combine="multiply", needs_policy=False, needs_probe=False, passes="0", acts=False,
    paper="DeepSeekMath (GRPO), arXiv 2402.03300", summary="every token gets the sequence advantage",
    effect=_uniform_effect,
)(grpo_scores)

register_credit(
    "oar-g", combine="multiply", needs_policy=True, needs_probe=True,
    passes="per scorer batch: 1 forward + 1 backward to the input embeddings (KL modes: + 1 clean forward)",
    paper=f"{OAR_PAPER} (OAR-G)",
    summary="|gradient × input| of the answer's log-probability on the reasoning embeddings, Bi-Level weights",
    effect=bilevel_effect, options={"mode": _mode("answer_joint"), "noise_std": _noise_std(None)},
    groups=(BILEVEL,), check=_noise_rule("mode"),
)(gradient_scores)

register_credit(
    "oar-p", combine="multiply", needs_policy=True, needs_probe=True,
    passes="per reasoning token: the probe suffix from that token (KV-cached prefix, chunk_size copies, any rows)",
    paper=f"{OAR_PAPER} (OAR-P)",
    summary="KL of the outcome when the token is replaced by pad (counterfactual), Bi-Level weights",
    effect=bilevel_effect, options={"mode": _mode("last"), "replace_id": REPLACE_ID, "chunk_size": CHUNK_SIZE,
                                    "span": Option(None, int, ">= 1"), "horizon": Option(None, int, ">= 0")},
    groups=(BILEVEL,),
)(perturbation_scores)

register_credit(
    "oar-pg", combine="multiply", needs_policy=True, needs_probe=True,
    passes="OAR-G's (1 forward + 1 backward to the inputs per scorer batch) + the probe suffix from each of "
           "OAR-G's top-k reasoning tokens (a fraction k of OAR-P's)",
    paper=f"extension of this project on {OAR_PAPER} (OAR-P guided by OAR-G)",
    summary="OAR-P exactly on OAR-G's top-k tokens, the rest OAR-G mapped onto OAR-P's scale per row, "
            "Bi-Level weights",
    options={"k": Option(0.25, float, "in (0, 1]"), "mode": _mode("last"), "guide_mode": _mode("answer_mean"),
             "noise_std": _noise_std(1e-3), "calibration": Option("median", str, choices=CALIBRATIONS),
             "replace_id": REPLACE_ID, "chunk_size": CHUNK_SIZE},
    effect=bilevel_effect, groups=(BILEVEL,), check=_noise_rule("guide_mode"),
)(guided_perturbation_scores)

register_credit(
    "oar-prefix", combine="multiply", needs_policy=True, needs_probe=True,
    passes="1 forward per scorer batch + per step boundary the conclude text and answer (a few tokens) on the "
           "row's cached prefix",
    paper=f"extension of this project on {OAR_PAPER}: the answer read after each step's prefix",
    summary="|change of the answer's log-probability across the token's step| with the probe cut after each step, "
            "Bi-Level weights",
    options={"chunk_size": Option(64, int, ">= 1")},  # its separator / boundary_ids: the group's step boundaries
    effect=bilevel_effect, groups=(BILEVEL,),
)(prefix_scores)

# --- baselines on OAR's probe and reshaping -----------------------------------------------------------------

register_credit(
    "entropy", combine="multiply", needs_policy=True, needs_probe=True, passes="1 forward per scorer batch",
    paper="baseline of this project (entropy as the importance score inside OAR's reshaping)",
    summary="entropy of the policy's next-token distribution at each reasoning token, Bi-Level weights",
    effect=bilevel_effect, groups=(BILEVEL,),
)(entropy_scores)

register_credit(
    "random", combine="multiply", needs_policy=False, needs_probe=True, passes="0",
    paper="control (this project): OAR's reshaping of U(0, 1) scores",
    summary="Bi-Level weights of random scores: the null for 'any reshaping helps'",
    effect=bilevel_effect, groups=(BILEVEL,),
)(random_scores)

# --- peer methods -------------------------------------------------------------------------------------------

register_credit(
    "entropy-mask", combine="mask", needs_policy=True, needs_probe=False,
    passes="1 forward of prompt + completion (no grad) per scorer batch",
    paper="Beyond the 80/20 Rule, arXiv 2506.01939",
    summary="advantage kept only on the batch's top-ρ (0.2) highest-entropy completion tokens, 0 elsewhere",
    effect=high_entropy_mask, options={"rho": Option(0.2, float, "in (0, 1]"), "temperature": TEMPERATURE},
    invert="batch",
)(entropy_mask_scores)

register_credit(
    "gtpo", combine="replace", needs_policy=True, needs_probe=False, needs_group=True,
    passes="1 forward of prompt + completion (no grad) per scorer batch",
    paper="GTPO and GRPO-S, arXiv 2508.04349",
    summary="token reward α1·(±1) + α2·(inverse-)entropy share among the group's completions at that position, "
            "z-scored per group; replaces the advantage",
    effect=gtpo_effect, options={"alpha1": Option(1.0, float), "alpha2": Option(0.1, float),
                                 "norm": Option("joint", str, choices=NORMS), "temperature": TEMPERATURE},
)(gtpo_scores)

register_credit(
    "ktae", combine="add", needs_policy=False, needs_probe=False, needs_group=True, passes="0 (group statistics)",
    paper="KTAE, arXiv 2505.16826",
    summary="key-token value of the token's id from the group's correct/wrong contingency table (Fisher, "
            "information gain, effect size, BM25 frequency), added to the advantage",
    effect=_identity_effect, invert="negate",
    options={"alpha": Option(1.0, float, ">= 0"), "beta": Option(1.0, float, ">= 0"),
             "top": Option(1.0, float, ">= 0")},
)(ktae_scores)

register_credit(
    "cf-span", combine="multiply", needs_policy=True, needs_probe=True,
    passes="≤ 10 probe suffixes per completion (one per masked span; OAR-P engine, KV-cached prefix)",
    paper="CF-GRPO, Beyond Uniform Credit, arXiv 2602.09331 (SCAPO's re-implementation settings)",
    summary="drop in answer probability when a reasoning span is replaced by pad, weight clip(1 + Δ/mean|Δ|, "
            "0.5, 4) on the span's tokens",
    effect=cf_span_weights, options={"chunk_size": CHUNK_SIZE, "renormalize": Option(False, bool)},
)(cf_span_scores)

VINE = OptionGroup("vine", {
    "separator": Option(VINE_SEPARATOR, str, regex=True), "max_steps": Option(8, int, ">= 1"),
    "k": Option(4, int, ">= 1"), "temperature": Option(None, float, "> 0"),
    "prefixes_per_call": Option(64, int, ">= 1"),
})

register_credit(
    "vine", combine="replace", needs_policy=True, needs_probe=False, needs_rollout=True, passes=VINE_PASSES,
    paper=VINE_PAPER,
    summary="ΔV of the token's step: V(after) − V(before), V = mean reward of K sampled continuations from the "
            "step boundary (the last V is the completion's reward); replaces the advantage",
    effect=replace_effect, groups=(VINE,), invert="negate",
)(vine_scores)

register_credit(
    "vine-w", combine="multiply", needs_policy=True, needs_probe=False, needs_rollout=True, passes=VINE_PASSES,
    paper=f"{VINE_PAPER}; mass-preserving form of this project",
    summary="GRPO's advantage spread over the steps: weight ∝ max(sign(A)·ΔV, 0) + eps, mean 1 over the completion",
    effect=weight_effect, options={"eps": Option(0.05, float, "> 0")}, groups=(VINE,), invert="negate",
)(vine_scores)


def _grail_bounds(options: dict) -> None:
    """GRAIL's clip interval must not be empty."""
    if options["w_min"] > options["w_max"]:
        raise ValueError(f"w_min must be <= w_max, got w_min={options['w_min']} w_max={options['w_max']}")


register_credit(
    "sc-grpo", combine="multiply", needs_policy=True, needs_probe=False, needs_group=True,
    passes="per scorer batch: 2 forwards (no grad) of the completion, after its prompt and after prompt ⊕ a verified "
           "solution of its group ⊕ prompt (the one teacher-forced pass of the self-teacher, and the policy's own)",
    paper=SC_GRPO_PAPER,
    summary="KL(policy ‖ policy conditioned on another verified completion of the group) at each token, divided by "
            "its mean over the completion; rows whose group has no other verified completion uniform",
    effect=sc_grpo_weights, options={"min_reward": Option(1.0, float), "temperature": TEMPERATURE},
)(sc_grpo_scores)

register_credit(
    "grail", combine="multiply", needs_policy=True, needs_probe=False, needs_group=True,
    passes="per scorer batch: 1 forward + 1 backward to the input embeddings of prompt ⊕ completion (rows with a "
           "boxed answer)",
    paper=GRAIL_PAPER,
    summary="‖gradient ⊙ input‖ of the boxed answer's log-probability at the position predicting the token, "
            "z-scored log per completion, mean + std·z clipped to [w_min, w_max]; the box's content w_max; rows "
            "symmetry leaves out, and those without a box, 1",
    effect=_identity_effect, check=_grail_bounds,
    options={"std": Option(0.5, float, "> 0"), "mean": Option(1.0, float, ">= 0"),
             "w_min": Option(0.5, float, ">= 0"), "w_max": Option(5.0, float, ">= 0"),
             "symmetry": Option("wrong", str, choices=SYMMETRIES), "temperature": TEMPERATURE},
)(grail_scores)
