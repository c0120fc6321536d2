"""Where the final answer sits in a completion's text: the one locator the probe and the grader share.

Pure Python (no torch). Character offsets, so the probe can map them onto token offsets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BOX_MARKERS: tuple[str, ...] = ("\\boxed{", "\\fbox{")
ANSWER_PHRASES: tuple[str, ...] = ("the final answer is", "the answer is", "answer:", "####")


@dataclass(frozen=True)
class AnswerSpan:
    """Character offsets in the completion text.

    ``start``: where the final-answer statement begins (the marker itself); everything before it is
    reasoning. ``answer_start:answer_end``: the answer text (inside the braces for a boxed answer).
    """

    start: int
    answer_start: int
    answer_end: int
    boxed: bool

    def answer(self, text: str) -> str:
        return text[self.answer_start : self.answer_end]


def _matching_brace(text: str, open_end: int) -> int | None:
    """Index of the ``}`` closing the brace opened just before ``open_end``; None if unclosed."""
    depth = 1
    for m in re.finditer(r"\\[{}]|[{}]", text[open_end:]):
        tok = m.group()
        if tok == "{":
            depth += 1
        elif tok == "}":
            depth -= 1
            if depth == 0:
                return open_end + m.start()
    return None


def _boxed_span(text: str, markers: tuple[str, ...]) -> AnswerSpan | None:
    best = max(((text.rfind(m), m) for m in markers), key=lambda p: p[0], default=(-1, ""))
    pos, marker = best
    if pos < 0:
        return None
    inner = pos + len(marker)
    close = _matching_brace(text, inner)
    if close is None:  # truncated completion: the last box never closes
        return None
    lo, hi = inner, close
    while lo < hi and text[lo].isspace():
        lo += 1
    while hi > lo and text[hi - 1].isspace():
        hi -= 1
    return AnswerSpan(start=pos, answer_start=lo, answer_end=hi, boxed=True) if hi > lo else None


def _phrase_span(text: str, phrases: tuple[str, ...]) -> AnswerSpan | None:
    lowered = text.lower()
    best = max(((lowered.rfind(p.lower()), p) for p in phrases), key=lambda p: p[0], default=(-1, ""))
    pos, phrase = best
    if pos < 0:
        return None
    rest_start = pos + len(phrase)
    line_end = text.find("\n", rest_start)
    line_end = len(text) if line_end < 0 else line_end
    lo, hi = rest_start, line_end
    strip_lead = " \t:$*"
    strip_trail = " \t.$*"
    while lo < hi and text[lo] in strip_lead:
        lo += 1
    while hi > lo and text[hi - 1] in strip_trail:
        hi -= 1
    return AnswerSpan(start=pos, answer_start=lo, answer_end=hi, boxed=False) if hi > lo else None


def locate_answer(
    text: str,
    box_markers: tuple[str, ...] = BOX_MARKERS,
    phrases: tuple[str, ...] = ANSWER_PHRASES,
) -> AnswerSpan | None:
    """Locate the final answer of a completion.

    The last closed ``\\boxed{...}`` (nested braces matched) wins; otherwise the last answer phrase
    ("the answer is", "####", ...) followed by text on the same line. Returns None when neither exists
    (including a completion whose last box was cut off before its closing brace).
    """
    return _boxed_span(text, box_markers) or _phrase_span(text, phrases)
