"""The shared final-answer locator."""

from __future__ import annotations

import pytest

from oar import locate_answer


@pytest.mark.parametrize(
    "text, answer, statement_start",
    [
        ("so x = 3. \\boxed{3}", "3", "\\boxed{3}"),
        ("first \\boxed{1} then \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}", "\\boxed{\\frac{1}{2}}."),
        ("a \\boxed{ {1, 2} } b", "{1, 2}", "\\boxed{ {1, 2} } b"),
        ("it is \\fbox{7}", "7", "\\fbox{7}"),
        ("Thus the answer is 42.", "42", "the answer is 42."),
        ("The final answer is: $x^2$", "x^2", "The final answer is: $x^2$"),
        ("work\n#### 1,000", "1,000", "#### 1,000"),
        ("brace \\boxed{a\\}b}", "a\\}b", "\\boxed{a\\}b}"),
    ],
)
def test_finds_answer(text, answer, statement_start):
    span = locate_answer(text)
    assert span is not None
    assert span.answer(text) == answer
    assert text[span.start :] == statement_start


@pytest.mark.parametrize("text", ["no answer here", "cut off \\boxed{12", "\\boxed{}", "the answer is   "])
def test_no_answer(text):
    assert locate_answer(text) is None


def test_box_beats_phrase_and_markers_configurable():
    text = "the answer is 5 \\boxed{6}"
    assert locate_answer(text).answer(text) == "6"
    assert locate_answer(text, box_markers=()).answer(text) == "5 \\boxed{6}"
