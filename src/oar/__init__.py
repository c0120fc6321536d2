"""oar: Outcome-grounded Advantage Reshaping for GRPO on math reasoning.

What a user of the method calls is importable from here: the core math, the probe and scorers, grading,
the TRL trainer, evaluation, and the credit views and report. The lab lives in ``oar.lab.*``, test oracles and
helpers in their modules (docs/architecture.md). Heavy modules (TRL, transformers) load on first use, so
``import oar`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it (one line per name; keep grouped by area)
_EXPORTS: dict[str, str] = {
    # core math
    "group_advantages": "oar.advantages",
    "bilevel_weights": "oar.reshape",
    "weight_stats": "oar.reshape",
    "masked_quantile": "oar.reshape",
    # token credit: the registry and the one function every caller runs
    "CreditBatch": "oar.credit",
    "CreditSpec": "oar.credit",
    "TokenCredit": "oar.credit",
    "credit_names": "oar.credit",
    "get_credit": "oar.credit",
    "register_credit": "oar.credit",
    "token_credit": "oar.credit",
    # answer location (shared by probe and grader)
    "AnswerSpan": "oar.answer_span",
    "locate_answer": "oar.answer_span",
    # importance: probe and scorers
    "OutcomeProbe": "oar.probe",
    "ProbeBatch": "oar.probe",
    "rollout_tensors": "oar.probe",
    "perturbation_scores": "oar.importance",
    "guided_perturbation_scores": "oar.importance.guided",
    "gradient_scores": "oar.importance",
    "uniform_scores": "oar.importance",
    "random_scores": "oar.importance",
    "entropy_scores": "oar.importance",
    # grading
    "extract_answer": "oar.grading",
    "grade_answer": "oar.grading",
    "grade_answers": "oar.grading",
    "gold_answer": "oar.grading",
    "normalize_gold": "oar.grading",
    "math_reward": "oar.grading",
    "make_math_reward": "oar.grading",
    "format_reward": "oar.grading",
    # trainer (TRL)
    "OARConfig": "oar.trainer",
    "OARGRPOTrainer": "oar.trainer",
    # evaluation
    "load_model_and_tokenizer": "oar.models",
    "EvalConfig": "oar.eval.run",
    "evaluate": "oar.eval.run",
    "load_benchmark": "oar.eval.benchmarks",
    "pass_at_k": "oar.eval.metrics",
    # visualisation
    "AttributionRecord": "oar.attribution",
    "attribute": "oar.attribution",
    "attribute_batch": "oar.attribution",
    "rank_correlation": "oar.attribution",
    "read_records": "oar.attribution",
    "render_html": "oar.viz.html",
    "write_html": "oar.viz.html",
    "render_terminal": "oar.viz.terminal",
    "write_report": "oar.viz.report",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'oar' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
