"""The built-in credit methods, registered with :func:`oar.credit.register_credit` on import.

OAR (arXiv 2601.07408): ``oar-g``, ``oar-p``; its extension ``oar-prefix``; baselines on the same probe: ``entropy``, ``random``; plain GRPO:
``grpo``; peer methods, each from its paper: ``entropy-mask``, ``gtpo``, ``ktae``, ``cf-span``
(:mod:`oar.peers`). The docs' method table (``docs/credits.md``) lists what each computes and costs.
"""

from __future__ import annotations

import torch

from oar.credit import CreditBatch, register_credit
from oar.importance import entropy_scores, gradient_scores, perturbation_scores, random_scores
from oar.importance.prefix import SEPARATOR, prefix_scores
from oar.reshape import BETA, FLOOR, TAU

OAR_PAPER = "Outcome-Grounded Advantage Reshaping, arXiv 2601.07408"
BILEVEL = {"tau": TAU, "beta": BETA, "floor": FLOOR}


def _uniform_effect(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(scores)


@register_credit(
    "grpo", combine="multiply", needs_policy=False, needs_probe=False, passes="0",
    paper="DeepSeekMath (GRPO), arXiv 2402.03300", summary="every token gets the sequence advantage",
    effect=_uniform_effect,
)
def grpo_scores(batch: CreditBatch) -> torch.Tensor:
    """``[B, T]`` zeros: plain GRPO has no per-token signal."""
    return torch.zeros(batch.completion_ids.shape, dtype=torch.float32, device=batch.completion_ids.device)


register_credit(
    "oar-g", combine="multiply", needs_policy=True, needs_probe=True,
    passes="per scorer batch: 1 forward + 1 backward to the input embeddings (KL modes: + 1 clean forward)",
    paper=f"{OAR_PAPER} (OAR-G)",
    summary="|gradient × input| of the answer's log-probability on the reasoning embeddings, Bi-Level weights",
    options={"mode": "answer_joint", "noise_std": None, **BILEVEL},
)(gradient_scores)

register_credit(
    "oar-p", combine="multiply", needs_policy=True, needs_probe=True,
    passes="per reasoning token: the probe suffix from that token (KV-cached prefix, chunk_size copies, any rows)",
    paper=f"{OAR_PAPER} (OAR-P)",
    summary="KL of the outcome when the token is replaced by pad (counterfactual), Bi-Level weights",
    options={"mode": "last", "replace_id": None, "chunk_size": 16, "span": None, "horizon": None, **BILEVEL},
)(perturbation_scores)

register_credit(
    "oar-prefix", combine="multiply", needs_policy=True, needs_probe=True,
    passes="1 forward per scorer batch + per step boundary the conclude text and answer (a few tokens) on the "
           "row's cached prefix",
    paper=f"extension of this project on {OAR_PAPER}: the answer read after each step's prefix",
    summary="|change of the answer's log-probability across the token's step| with the probe cut after each step, "
            "Bi-Level weights",
    options={"separator": SEPARATOR, "boundary_ids": None, "chunk_size": 64, **BILEVEL},
)(prefix_scores)

register_credit(
    "entropy", combine="multiply", needs_policy=True, needs_probe=True, passes="1 forward per scorer batch",
    paper="baseline of this project (entropy as the importance score inside OAR's reshaping)",
    summary="entropy of the policy's next-token distribution at each reasoning token, Bi-Level weights",
    options=dict(BILEVEL),
)(entropy_scores)

register_credit(
    "random", combine="multiply", needs_policy=False, needs_probe=True, passes="0",
    paper="control (this project): OAR's reshaping of U(0, 1) scores",
    summary="Bi-Level weights of random scores: the null for 'any reshaping helps'",
    options=dict(BILEVEL),
)(random_scores)

from oar import peers as _peers  # noqa: E402,F401  (registers the peer methods)
from oar.importance import guided as _guided  # noqa: E402,F401  (registers oar-pg)
