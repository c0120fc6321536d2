"""oar.lab.task.steps_from_end (the fidelity study's weight by step): each character's step, counted back from the
answer."""

from __future__ import annotations

from oar.lab.task import steps_from_end


def test_steps_are_counted_back_from_the_answer():
    text = "57+8=65; ok; 65-6=59; \\boxed{59}"
    steps = steps_from_end(text, len(text) + 2)
    assert steps[: len("57+8=65")] == [2] * 7 and steps[7:13] == [0] * 6
    assert steps[13:20] == [1] * 7 and steps[20:] == [0] * (len(text) + 2 - 20)
