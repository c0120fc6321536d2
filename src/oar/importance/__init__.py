"""Token importance scorers (OAR_SPEC §3) and their registry.

Every scorer has the signature ``scorer(model, input_ids, attention_mask, reasoning_mask, answer_mask,
**options) -> Tensor[B, L]`` (float32, 0 outside the reasoning) over an outcome probe.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from oar.importance.baselines import entropy_scores, random_scores, uniform_scores
from oar.importance.gradient import gradient_scores
from oar.importance.perturbation import perturbation_scores, perturbation_scores_naive

Scorer = Callable[..., torch.Tensor]

SCORERS: dict[str, Scorer] = {
    "oar-p": perturbation_scores,
    "oar-g": gradient_scores,
    "uniform": uniform_scores,
    "random": random_scores,
    "entropy": entropy_scores,
}


def get_scorer(name: str) -> Scorer:
    """The scorer registered under ``name`` (case-insensitive); ValueError listing valid names."""
    key = name.lower() if isinstance(name, str) else name
    if key not in SCORERS:
        raise ValueError(f"unknown scorer {name!r}; valid scorers: {', '.join(SCORERS)}")
    return SCORERS[key]


__all__ = [
    "SCORERS",
    "entropy_scores",
    "get_scorer",
    "gradient_scores",
    "perturbation_scores",
    "perturbation_scores_naive",
    "random_scores",
    "uniform_scores",
]
