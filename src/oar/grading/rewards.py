"""TRL reward functions built on the grader: ``math_reward``, ``make_math_reward``, ``format_reward``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from oar.answer_span import locate_answer
from oar.grading.extraction import completion_text
from oar.grading.verify import grade_batch


def math_reward(
    prompts: Sequence[Any] | None,
    completions: Sequence[str | Sequence[Mapping[str, Any]]],
    answer: Sequence[Any] | None = None,
    *,
    answer_key: str = "answer",
    log_metric: Callable[[str, float], None] | None = None,
    **kwargs: Any,
) -> list[float]:
    """TRL reward function: 1.0 when the completion's final answer equals the gold answer, else 0.0.

    Use directly as ``reward_funcs=[math_reward]`` on a dataset with an ``answer`` column (raw GSM8K
    solutions are fine), or :func:`make_math_reward` for another column name. Never raises for an item: one
    whose grading fails earns 0.0. ``log_metric`` (TRL hands it to reward functions) receives the counts of
    this call's grading errors and math-verify timeouts as ``grading/errors`` and ``grading/timeouts``.
    """
    golds = answer if answer_key == "answer" else kwargs.get(answer_key)
    if golds is None:
        raise ValueError(f"math_reward needs the gold answers in the dataset column {answer_key!r}")
    grades = grade_batch(completions, golds)
    if callable(log_metric):
        log_metric("grading/errors", float(grades.errors))
        log_metric("grading/timeouts", float(grades.timeouts))
    return [float(ok) for ok in grades.verdicts]


def make_math_reward(answer_key: str) -> Callable[..., list[float]]:
    """:func:`math_reward` reading the gold answers from column ``answer_key`` (a named function, for TRL)."""

    def reward(prompts, completions, **kwargs):
        return math_reward(prompts, completions, answer_key=answer_key, **kwargs)

    reward.__name__ = f"math_reward_{answer_key}"
    return reward


def format_reward(
    prompts: Sequence[Any] | None, completions: Sequence[str | Sequence[Mapping[str, Any]]], **kwargs: Any
) -> list[float]:
    """TRL reward function: 1.0 when the completion states its answer in a closed ``\\boxed{...}``."""
    spans = (locate_answer(completion_text(c), phrases=()) for c in completions)
    return [float(span is not None) for span in spans]
