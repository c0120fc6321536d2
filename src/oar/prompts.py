"""The one prompt template of training and evaluation: a user message with a ``{question}`` placeholder, and
the columns a raw training row holds (``oar train``, :func:`oar.train_data.load_train_dataset` and the README)."""

from __future__ import annotations

QUESTION_COLUMN = "problem"  # raw row: the problem text, filled into {question}
ANSWER_COLUMN = "answer"  # raw row: the gold answer (a boxed solution or "#### n" is fine)
SOLUTION_COLUMN = "solution"  # raw row: a worked solution, shown as an example turn (oar train --worked_examples)
PLACEHOLDER = "{question}"
PROMPT_TEMPLATE = PLACEHOLDER + "\nPlease reason step by step, and put your final answer within \\boxed{}."


def check_template(template: str) -> str:
    """``template`` itself; ValueError when it lacks the ``{question}`` placeholder."""
    if PLACEHOLDER not in template:
        hint = " (oar train's '{prompt}' is now '{question}', as in oar eval)" if "{prompt}" in template else ""
        raise ValueError(f"prompt template must contain '{PLACEHOLDER}'{hint}: {template!r}")
    return template


def fill_template(template: str, question: str) -> str:
    """``template`` with ``{question}`` replaced (plain replacement: LaTeX braces such as ``\\boxed{}`` need no
    escaping)."""
    return check_template(template).replace(PLACEHOLDER, question)
