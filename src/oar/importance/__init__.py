"""Token importance scorers (OAR_SPEC §3).

Every scorer has the signature ``scorer(model, input_ids, attention_mask, reasoning_mask, answer_mask,
**options) -> Tensor[B, L]`` (float32, 0 outside the reasoning) over an outcome probe. They are registered as
credit methods (``oar-g``, ``oar-p``, ``oar-pg``, ``entropy``, ``random``) in :mod:`oar.credit.catalogue`:
``get_credit(name).score`` is the scorer.
"""

from __future__ import annotations

from oar.importance.baselines import entropy_scores, random_scores, uniform_scores
from oar.importance.gradient import gradient_scores
from oar.importance.perturbation import line_segments, perturbation_scores, perturbation_scores_naive

__all__ = [
    "entropy_scores",
    "gradient_scores",
    "line_segments",
    "perturbation_scores",
    "perturbation_scores_naive",
    "random_scores",
    "uniform_scores",
]
