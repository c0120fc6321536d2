"""Answer extraction and gold normalisation, and the fast path that settles plain answers without math-verify."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from oar.answer_span import locate_answer

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


def normalize_gold(gold: Any) -> str:
    """A gold answer as one LaTeX string: GSM8K ``#### n`` solutions, floats (``27.0`` -> ``27``),
    zero-padded integers (``025`` -> ``25``), OlympiadBench lists of ``$...$`` pieces (joined by commas).
    """
    if isinstance(gold, bool) or gold is None:
        raise ValueError(f"gold answer must be text or a number, got {gold!r}")
    if isinstance(gold, int | float):
        return _format_number(float(gold))
    if isinstance(gold, Sequence) and not isinstance(gold, str):
        return ", ".join(normalize_gold(g) for g in gold)
    text = str(gold)
    if "####" in text:
        text = text.split("####")[-1]
    text = ", ".join(p.strip().strip("$").strip() for p in re.split(r"\$\s*,\s*\$", text.strip()))
    num = _as_number(text)
    integer = num is not None and not num[1] and num[0].is_integer() and abs(num[0]) < 1e15
    return str(int(num[0])) if integer else text


def missing_gold(gold: Any) -> bool:
    """Whether ``gold`` holds no answer: None, NaN (a missing cell), or text that normalises to nothing."""
    if gold is None or (isinstance(gold, float) and math.isnan(gold)):
        return True
    if isinstance(gold, Sequence) and not isinstance(gold, str) and not gold:
        return True
    try:
        return not normalize_gold(gold).strip()
    except ValueError:
        return True


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

_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_FRACTION = re.compile(r"([+-]?)\s*(?:\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}|(\d+)\s*/\s*(\d+))")
# a trailing unit: \text{...}, degrees, or plain words (not math such as "pi", "sqrt")
_UNIT = re.compile(
    r"\\(?:text|mathrm|mbox)\{[^{}]*\}|\^\{?\\circ\}?"
    r"|(?!(?:pi|sqrt|log|ln|sin|cos|tan|exp)\b)[A-Za-z]{2,}(?: [A-Za-z]+)*"
)
# sympy would evaluate these in C code that no timer interrupts: power towers, 4+ digit exponents/factorials
_HUGE = re.compile(r"\^\s*\{[^{}]*\^|\^\s*\{?\s*[+-]?\d{4,}|\d{4,}\s*!")
_LATEX_SPACES = re.compile(r"\\[,;:! ]|\\q?quad|~|\{,\}")


def _format_number(x: float) -> str:
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def _as_number(text: str) -> tuple[float, bool] | None:
    """(value, is_percent) when ``text`` is one plain number or integer fraction, maybe with ``$``, a percent
    sign or a unit."""
    s = _LATEX_SPACES.sub("", text).replace("\\$", "").replace("$", "").strip().rstrip(".").strip()
    s = _THOUSANDS.sub("", s)
    frac = _FRACTION.fullmatch(s)
    if frac is not None:
        sign, num, den = frac.group(1), frac.group(2) or frac.group(4), frac.group(3) or frac.group(5)
        return ((-1 if sign == "-" else 1) * int(num) / int(den), False) if int(den) else None
    pct = s.endswith("%")
    if pct:
        s = s.rstrip("%").removesuffix("\\").strip()
    m = _NUMBER.match(s)
    if m is None:
        return None
    rest = s[m.end() :].strip()
    if rest and (pct or _UNIT.fullmatch(rest) is None):
        return None
    try:
        value = float(m.group())
    except ValueError:
        return None
    return (value, pct) if math.isfinite(value) else None


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def _fast_grade(pred: str, gold: str) -> bool | None:
    """True/False when cheap rules settle it, None when math-verify must decide."""
    if "".join(pred.split()) == "".join(gold.split()):
        return True
    p, g = _as_number(pred), _as_number(gold)
    if p is None or g is None:
        return False if len(pred) > MAX_ANSWER_CHARS or _HUGE.search(pred) else None
    (pv, ppct), (gv, gpct) = p, g
    candidates = {pv, pv / 100} if ppct else {pv}
    targets = {gv, gv / 100} if gpct else {gv}
    return any(_close(c, t) for c in candidates for t in targets)
