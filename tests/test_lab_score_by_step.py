"""benchmarks/lab_score_by_step.py: each character's step, counted back from the answer."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

from lab_score_by_step import steps_from_end  # noqa: E402


def test_steps_are_counted_back_from_the_answer():
    text = "57+8=65; ok; 65-6=59; \\boxed{59}"
    steps = steps_from_end(text, len(text) + 2).tolist()
    assert steps[: len("57+8=65")] == [2] * 7 and steps[7:13] == [0] * 6
    assert steps[13:20] == [1] * 7 and steps[20:] == [0] * (len(text) + 2 - 20)
