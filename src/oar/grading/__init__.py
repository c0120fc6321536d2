"""The one grader: answer extraction, gold normalisation, math-verify equivalence and TRL rewards.

Grading runs in two stages. A cheap in-process fast path settles exact matches and plain numbers (GSM8K,
AIME, AMC answers: leading zeros, "27.0", thousands commas, percentages, trailing units), compared exactly
unless the gold is a decimal, and refuses answers that would make sympy compute huge integers. Everything else
goes to math-verify in a helper subprocess (``python -m oar.grading``) that bounds every item with a
timer in its own main thread, so grading is safe from any thread or process of the caller, and the
caller kills and restarts the helper when an item overruns its deadline (e.g. stuck in C code).

Modules: ``extraction`` (text cleaning, final answer, gold normalisation, the fast path), ``numbers`` (exact
values, the tolerance of a decimal gold, the size bound on sympy's integers), ``verify`` (the math-verify helper
pool, ``grade_batch``/``grade_answers``), ``rewards`` (TRL reward functions); the public names are importable
from here.
"""

from oar.grading.extraction import (
    MAX_ANSWER_CHARS,
    clean_text,
    completion_text,
    extract_answer,
    gold_answer,
    missing_gold,
    normalize_gold,
)
from oar.grading.rewards import format_reward, make_math_reward, math_reward
from oar.grading.verify import DEFAULT_TIMEOUT, Grades, grade_answer, grade_answers, grade_batch

__all__ = [
    "DEFAULT_TIMEOUT",
    "Grades",
    "MAX_ANSWER_CHARS",
    "clean_text",
    "completion_text",
    "extract_answer",
    "format_reward",
    "gold_answer",
    "grade_answer",
    "grade_answers",
    "grade_batch",
    "make_math_reward",
    "math_reward",
    "missing_gold",
    "normalize_gold",
]
