"""Answer extraction and gold normalisation, and the fast path that settles plain answers without math-verify."""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from oar.answer_span import locate_answer
from oar.grading.numbers import THOUSANDS, numbers_match, plain_number, too_costly

MAX_ANSWER_CHARS = 1000  # longer extracted answers are only compared as strings

# A bare answer (a completion with no final-answer statement) must be one plain math expression: these LaTeX
# commands, single letters (variables, choices), function names, digits and operators; no words.
_MATH_COMMANDS = frozenset(
    "frac dfrac tfrac sqrt pi infty left right cdot times div pm mp le leq leqslant ge geq geqslant ne neq lt gt "
    "approx circ degree quad qquad nmid cup cap in notin subset subseteq emptyset varnothing setminus mid to dots "
    "ldots cdots binom dbinom lfloor rfloor lceil rceil angle overline bar hat vec prime mathbb mathbf displaystyle "
    "sin cos tan cot sec csc arcsin arccos arctan log ln exp max min gcd lcm mod pmod big Big "
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi rho sigma "
    "tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Phi Psi Omega".split()
)
_FUNCTIONS = frozenset("sin cos tan cot sec csc arcsin arccos arctan log ln exp sqrt pi max min gcd lcm mod".split())
_TEXT = re.compile(r"\\(?:text|textbf|textit|mathrm|mbox|operatorname)\{[^{}]*\}")
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\{[A-Za-z]*\*?\}")
_COMMAND = re.compile(r"\\(?:([A-Za-z]+)|[{}%$,;:! \\|])")
_LETTERS = re.compile(r"[A-Za-z]+")
_MATH_CHARS = re.compile(r"[0-9A-Za-z\s+\-*/^_=<>()\[\]{}|,.;:!'%&$]*")


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The text of a completion: a string, or TRL's conversational form (a list of message dicts)."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content") or "") for m in completion if m.get("role") in (None, "assistant"))


# control and format characters (NUL, escape, zero-width spaces, BOM, bidi marks, soft hyphen): they do not print
_INVISIBLE = [*range(0x00, 0x09), *range(0x0E, 0x1C), *range(0x7F, 0x85), *range(0x86, 0xA0), 0xAD, 0x61C,
              0x180E, *range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2060, 0x2065),
              *range(0x2066, 0x2070), 0xFEFF]
_SUPERSCRIPTS = "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱ"
_SUBSCRIPTS = "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎"
_VULGAR = "¼½¾⅐⅑⅒⅓⅔⅕⅖⅗⅘⅙⅚⅛⅜⅝⅞↉"


def _vulgar_latex(char: str) -> str:
    num, den = "".join(chr(int(h, 16)) for h in unicodedata.decomposition(char).split()[1:]).split("\u2044")
    return f"\\frac{{{num}}}{{{den}}}"


_TRANSLATE = {
    **dict.fromkeys(_INVISIBLE),
    **{ord(c): _vulgar_latex(c) for c in _VULGAR},
    ord("\u2212"): "-", ord("\u2044"): "/", ord("\u2215"): "/", ord("\u221e"): "\\infty ",
}
_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f]+")
_SCRIPT_RUN = re.compile(f"[{_SUPERSCRIPTS}]+|[{_SUBSCRIPTS}]+")
_SCRIPT_PLAIN = str.maketrans(_SUPERSCRIPTS + _SUBSCRIPTS, "0123456789+-=()ni" + "0123456789+-=()")


def _script(m: re.Match) -> str:
    run = m.group()
    return ("^{" if run[0] in _SUPERSCRIPTS else "_{") + run.translate(_SCRIPT_PLAIN) + "}"


def clean_text(text: str) -> str:
    """``text`` as the grader reads it: control and format characters deleted (``1\\x00`` is ``1``: they do not
    print), Unicode vulgar fractions as ``\\frac{a}{b}`` (``½``), superscript and subscript runs as ``^{...}`` /
    ``_{...}`` (``x²``, ``10³``, ``x⁻¹``), the minus sign ``−`` as ``-``, the fraction slash as ``/``, ``∞`` as
    ``\\infty``. Linear in the length of ``text``."""
    if text.isascii():  # the common case: only ASCII controls to delete (a scan in C, no per-character lookup)
        return _ASCII_CONTROL.sub("", text) if _ASCII_CONTROL.search(text) else text
    return _SCRIPT_RUN.sub(_script, text.translate(_TRANSLATE))


_SPACE_RUN = re.compile(r"\s+")
_LONE_SPACE = re.compile(r"(?<![0-9A-Za-z]) | (?![0-9A-Za-z])")


def squash_spaces(text: str) -> str:
    """``text`` with every run of white space removed, except one space between two letters or digits: spacing
    around operators and braces does not matter, but ``4 2`` is not ``42``."""
    return _LONE_SPACE.sub("", _SPACE_RUN.sub(" ", text).strip())


def extract_answer(text: str) -> str | None:
    """Final answer of a completion: the last ``\\boxed{...}``, else a final "answer is ..." / "#### ...",
    else the whole text when it is a bare answer (the rule of ``_bare_answer``).

    None when nothing is found (also for a completion cut off inside its last box).
    """
    span = locate_answer(text)
    if span is not None:
        return span.answer(text)
    return _bare_answer(text)


def _bare_answer(text: str) -> str | None:
    """``text`` without surrounding spaces and ``$``/``\\(...\\)``/``\\[...\\]`` when the whole of it is one plain
    answer, else None.

    Plain: one line of at most ``MAX_ANSWER_CHARS`` characters holding only digits, operators and brackets,
    single letters (variables, choices), function names (``sin``, ``log``, ``sqrt``, ...), the LaTeX math
    commands of ``_MATH_COMMANDS`` and ``\\text{...}`` groups (units, text answers). A word outside
    ``\\text{}`` (``"1+5 is 6"``, ``"6 apples"``), an unknown command (``\\boxed`` cut off, ``\\boxe``), a
    second line or any other character makes it prose: no answer.
    """
    s = text.strip()
    if s.startswith(("\\(", "\\[")) and s.endswith(("\\)", "\\]")):
        s = s[2:-2]
    s = s.strip().strip("$").strip()
    if not s or len(s) > MAX_ANSWER_CHARS or "\n" in s:
        return None
    rest = _ENVIRONMENT.sub(" ", _TEXT.sub(" ", s))
    for m in _COMMAND.finditer(rest):
        if m.group(1) is not None and m.group(1) not in _MATH_COMMANDS:
            return None
    rest = _COMMAND.sub(" ", rest)
    if _MATH_CHARS.fullmatch(rest) is None:
        return None
    if any(len(w) > 1 and w not in _FUNCTIONS for w in _LETTERS.findall(rest)):
        return None
    return s


_DOLLAR_PIECES = re.compile(r"\$\s*,\s*\$")  # "$a$, $b$": OlympiadBench answers of several pieces


def normalize_gold(gold: Any) -> str:
    """A gold answer as one LaTeX string: GSM8K ``#### n`` solutions, numbers (``27.0`` -> ``27``; integers keep
    every digit), zero-padded integers (``025`` -> ``25``), OlympiadBench lists of ``$...$`` pieces (joined by
    commas); text as :func:`clean_text` reads it. ValueError for a bool, None or a non-finite number.
    """
    if isinstance(gold, bool) or gold is None:
        raise ValueError(f"gold answer must be text or a number, got {gold!r}")
    if isinstance(gold, int):
        return _int_text(gold)
    if isinstance(gold, float):
        if not math.isfinite(gold):
            raise ValueError(f"gold answer must be a finite number, got {gold!r}")
        return _int_text(int(gold)) if gold.is_integer() and abs(gold) < 1e15 else repr(gold)
    if not isinstance(gold, str) and isinstance(gold, Sequence):
        return ", ".join(normalize_gold(g) for g in gold)
    return _normalize_text(str(gold))


@functools.lru_cache(maxsize=8192)  # a group of G completions shares its gold: normalise it once
def _normalize_text(text: str) -> str:
    text = clean_text(text)
    if "####" in text:
        text = text.split("####")[-1]
    text = ", ".join(p.strip().strip("$").strip() for p in _DOLLAR_PIECES.split(text.strip()))
    num = plain_number(text)
    integer = num is not None and not num.percent and num.value.denominator == 1 and abs(num.value) < 10**15
    return str(num.value.numerator) if integer else text


def _int_text(n: int) -> str:
    """The decimal digits of ``n``, also past Python's 4300-digit ``str(int)`` limit."""
    try:
        return str(n)
    except ValueError:
        high, low = divmod(abs(n), 10**4000)
        return ("-" if n < 0 else "") + _int_text(high) + str(low).zfill(4000)


def missing_gold(gold: Any) -> bool:
    """Whether ``gold`` holds no answer: None, NaN (a missing cell), or text that normalises to nothing."""
    return gold_text(gold) is None


def gold_text(gold: Any) -> str | None:
    """:func:`normalize_gold` of ``gold``, or None when it holds no answer (:func:`missing_gold`)."""
    if gold is None or (isinstance(gold, float) and math.isnan(gold)):
        return None
    if not isinstance(gold, str) and isinstance(gold, Sequence) and not gold:
        return None
    try:
        text = normalize_gold(gold)
    except ValueError:
        return None
    return text if text.strip() else None


def gold_answer(row: Mapping[str, Any], benchmark: str | None = None) -> str:
    """The gold answer of a benchmark row (GSM8K, MATH-500, AIME, AMC, Minerva, OlympiadBench layouts).

    ``final_answer`` (OlympiadBench) wins, then ``answer``; rows with only a ``solution`` (Minerva) use
    its last boxed expression. ``benchmark`` only sharpens the error message.
    """
    for key in ("final_answer", "answer"):
        if row.get(key) is not None:
            return normalize_gold(row[key])
    solution = row.get("solution")
    if isinstance(solution, list):
        solution = "\n".join(solution)
    if isinstance(solution, str):
        span = locate_answer(solution, phrases=())
        if span is not None:
            return normalize_gold(span.answer(solution))
    where = f" of benchmark {benchmark!r}" if benchmark else ""
    raise ValueError(f"row{where} has no gold answer (no final_answer/answer/boxed solution): {sorted(row)}")


# ---------------------------------------------------------------------------------------------- fast path

# digits separated by white space only (a LaTeX space too): never one number, never a sum
_DIGIT_GAP = re.compile(r"\d(?:\s|\\[,;:> ]|\\q?quad(?![A-Za-z])|~)+\d")
_FRAC_DIGITS = re.compile(r"\\([dtc]?frac|[dt]?binom)\s*(\d)\s*(\d)")  # \frac 1 2: two arguments, no gap


def _digit_gap(text: str) -> bool:
    return _DIGIT_GAP.search(_FRAC_DIGITS.sub(r"\\\1{\2}{\3}", THOUSANDS.sub("", text))) is not None


def _fast_grade(pred: str, gold: str) -> bool | None:
    """True/False when cheap rules settle it, None when math-verify must decide.

    Equal up to white space (:func:`squash_spaces`); plain numbers by :func:`oar.grading.numbers.numbers_match`
    (exact, or within the tolerance of a decimal gold); and False, without math-verify, when either side is over
    ``MAX_ANSWER_CHARS``, has digits separated by white space, or would make sympy compute a huge integer
    (:func:`oar.grading.numbers.too_costly`).
    """
    if squash_spaces(pred) == squash_spaces(gold):
        return True
    p, g = plain_number(pred), plain_number(gold)
    if p is not None and g is not None:
        return numbers_match(p, g)
    if max(len(pred), len(gold)) > MAX_ANSWER_CHARS or _digit_gap(pred) or _digit_gap(gold):
        return False
    return False if too_costly(pred) or too_costly(gold) else None

