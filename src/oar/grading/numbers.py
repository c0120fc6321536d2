"""Numbers in answers: the exact value of a plain number, the tolerance of a decimal gold, and a bound on the size
of the integers an expression would make sympy compute (powers, factorials, binomials), checked before it does.

Pure Python (``fractions``): no float ever stands between a written number and its comparison, so
``1234568`` never equals ``1234567`` and a 400-digit integer keeps every digit.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from fractions import Fraction

REL_TOL = Fraction(1, 10**6)  # relative tolerance against a decimal gold (also capped at half its last digit)
MAX_DIGITS = 10_000  # integers an answer would make sympy compute must stay below this many digits
_MAX_LITERAL = 4000  # digits of a literal, and |exponent| of scientific notation, read exactly (int() allows 4300)


@dataclass(frozen=True)
class PlainNumber:
    """A plain number as written: exact ``value``; ``percent`` when written with ``%``; ``unit`` the place value
    of its last written digit when it is a decimal (``2.50`` -> 1/100, ``4.5e33`` -> 10**32), None when it is
    exact (an integer or an integer fraction)."""

    value: Fraction
    percent: bool = False
    unit: Fraction | None = None


# digit-group separators between groups of three digits: ``1,000``, ``1{,}000``, ``1\,000``, ``10,\!080``
THOUSANDS = re.compile(r"(?<=\d)(?:,\\!|\{,\}|\\,|,)(?=\d{3}(?!\d))")
_LATEX_SPACES = re.compile(r"\\[,;:> ]|\\q?quad(?![A-Za-z])|~")  # thin to wide spaces: a space, never a join
_NUMBER = re.compile(  # sign, integer part, decimals, then an exponent: e-notation or "\times 10^{n}"
    r"([+-]?)(\d*)(?:\.(\d*))?"
    r"(?:[eE]([+-]?\d+)|\s*(?:\\times|\\cdot|\*)\s*10\s*\^\s*(?:\{\s*([+-]?\d+)\s*\}|(\d)))?"
)
_INT = r"\s*([+-]?\s*\d+)\s*"
_FRACTION = re.compile(
    r"([+-]?)\s*(?:\\[dtc]?frac\s*(?:\{" + _INT + r"\}|(\d))\s*(?:\{" + _INT + r"\}|(\d))"
    r"|(\d+)\s*/\s*(\d+))"
)
# a trailing unit: \text{...}, degrees, or plain words (not math such as "pi", "sqrt")
_UNIT = re.compile(
    r"\\(?:text|mathrm|mbox)\{[^{}]*\}|\^\{?\\circ\}?"
    r"|(?!(?:pi|sqrt|log|ln|sin|cos|tan|exp)\b)[A-Za-z]{2,}(?: [A-Za-z]+)*"
)


@functools.lru_cache(maxsize=8192)  # a group of G completions shares its gold: read it once
def plain_number(text: str) -> PlainNumber | None:
    """``text`` as one plain number (integer, decimal, scientific notation ``4.5e33`` / ``4.5 \\times 10^{33}``,
    integer fraction ``\\frac{a}{b}`` / ``\\frac12`` / ``a/b``), maybe with ``$``, digit-group separators, a
    percent sign or a trailing unit; None otherwise. Digits separated by a space (``4 2``) are not one number."""
    if text.isdigit() and text.isascii() and len(text) <= _MAX_LITERAL:  # the common case, without regexes
        return PlainNumber(Fraction(int(text)))
    s = THOUSANDS.sub("", text).replace("\\!", "")  # \! is a negative space: never a separator
    s = _LATEX_SPACES.sub(" ", s).replace("\\$", "").replace("$", "").strip()
    s = s.rstrip(".").strip()
    frac = _FRACTION.fullmatch(s)
    if frac is not None:
        sign, n1, n2, d1, d2, n3, d3 = frac.groups()
        num, den = (n1 or n2 or n3).replace(" ", ""), (d1 or d2 or d3).replace(" ", "")
        if max(len(num), len(den)) > _MAX_LITERAL or not int(den):
            return None
        value = Fraction(int(num), int(den))
        return PlainNumber(-value if sign == "-" else value)
    percent = s.endswith("%")
    if percent:
        s = s[:-1].removesuffix("\\").strip()
    m = _NUMBER.match(s)
    sign, whole, decimals, e_exponent, latex_exponent, digit_exponent = m.groups()
    exponent = e_exponent or latex_exponent or digit_exponent
    if not (whole or decimals):
        return None
    rest = s[m.end() :].strip()
    if rest and (percent or _UNIT.fullmatch(rest) is None):
        return None
    if len(whole) + len(decimals or "") > _MAX_LITERAL or (exponent and not -_MAX_LITERAL <= int(exponent[:8])
                                                         <= _MAX_LITERAL):
        return None
    digits, places = int((whole or "0") + (decimals or "")), len(decimals or "") - int(exponent or 0)
    value = Fraction(digits * 10 ** -places) if places <= 0 else Fraction(digits, 10**places)
    unit = None if decimals is None else Fraction(10**-places) if places <= 0 else Fraction(1, 10**places)
    return PlainNumber(-value if sign == "-" else value, percent, unit)


def tolerance(pred: Fraction, target: Fraction, unit: Fraction | None) -> Fraction:
    """How far ``pred`` may be from a gold of value ``target``: 0 for an exact gold (``unit`` None), else a
    relative :data:`REL_TOL` (of the larger magnitude, as ``math.isclose``), never more than half a unit of the
    gold's last written digit."""
    return Fraction(0) if unit is None else min(REL_TOL * max(abs(pred), abs(target)), unit / 2)


def numbers_match(pred: PlainNumber, gold: PlainNumber) -> bool:
    """Is ``pred`` the number ``gold``? Exactly for an integer or fraction gold, within :func:`tolerance` for a
    decimal one; a percentage on either side may also be read divided by 100 (``50%`` equals ``50`` and ``0.5``)."""
    candidates = {pred.value, pred.value / 100} if pred.percent else {pred.value}
    targets = [(gold.value, gold.unit)]
    if gold.percent:
        targets.append((gold.value / 100, None if gold.unit is None else gold.unit / 100))
    return any(abs(c - t) <= tolerance(c, t, u) for c in candidates for t, u in targets)


# ------------------------------------------------------------------------------------- cost of evaluation

_TOKEN = re.compile(r"\d+(?:\.\d*)?|\.\d+|\\[A-Za-z]+|\\.|\S")
_OPEN = {"(": ")", "[": "]", "{": "}", "\\{": "\\}", "\\lbrace": "\\rbrace", "\\langle": "\\rangle"}
_CLOSERS = frozenset(_OPEN.values())
_ADD = frozenset("+ - = < > , ; & | \\pm \\mp \\\\ \\le \\leq \\ge \\geq \\ne \\neq \\approx \\to \\cup \\cap "
                 "\\in \\quad \\qquad \\colon \\mid".split())
_MUL = frozenset("* / \\cdot \\times \\div \\ast".split())
_TWO_ARGS = frozenset("\\frac \\dfrac \\tfrac \\cfrac \\binom \\dbinom \\tbinom".split())
_SKIP_GROUP = frozenset("\\text \\textbf \\textit \\mathrm \\mbox \\operatorname \\begin \\end \\mathbb \\mathbf "
                        "\\mathcal \\mathit \\boldsymbol".split())
_IGNORED = frozenset("\\left \\right \\big \\Big \\bigg \\Bigg \\bigl \\bigr \\Bigl \\Bigr \\displaystyle \\, \\; "
                     "\\: \\! \\limits".split()) | {"\\ "}
_MAX_DEPTH = 60
_LOG10_2 = math.log10(2)

Bound = float | None  # an upper bound on log10 |value| of a number (>= 0), None for a symbolic expression


class _Huge(Exception):
    pass


def too_costly(text: str) -> bool:
    """Would sympy have to compute an integer of more than :data:`MAX_DIGITS` digits (or a polynomial of degree
    above it) to evaluate ``text``?

    A conservative estimate from an upper bound on log10 of every numeric intermediate (a decimal counts as the
    integer of its digits, a fraction as its numerator times its denominator): powers ``a^b`` (``(9^9)^(9^9)``,
    towers), factorials and double factorials ``n!``, ``n!!``, ``\\Gamma(n)``, binomials ``\\binom{n}{k}`` /
    ``{n \\choose k}``, products ``\\prod``; a symbol raised to a numeric power counts that power as digits.
    Expressions in symbols (``e^{hc/(\\lambda k T)}``) are not evaluated by sympy and cost nothing here. Brackets
    nested deeper than 60 count as too costly. Linear in the length of ``text``.
    """
    try:
        _Bounds(_TOKEN.findall(text)).expression(())
    except (_Huge, RecursionError):
        return True
    return False


def _check(log10: float) -> float:
    if not log10 < MAX_DIGITS:  # NaN-safe: inf and NaN are refused
        raise _Huge
    return log10


def _linear(log10: float) -> float:
    """10**log10, or inf past a float's range (a caller then refuses)."""
    return 10.0**log10 if log10 < 300 else math.inf


def _add(a: Bound, b: Bound) -> Bound:
    return None if a is None or b is None else _check(max(a, b) + _LOG10_2)


def _multiply(a: Bound, b: Bound) -> Bound:
    return None if a is None or b is None else _check(a + b)


def _power(base: Bound, exponent: Bound) -> Bound:
    if exponent is None:  # a symbolic exponent: sympy keeps the power as it is
        return None
    if base is None:  # x^n: a polynomial of degree n
        _check(_linear(exponent))
        return None
    return 0.0 if base == 0 else _check(_linear(exponent) * base)  # 0^b and 1^b do not grow


def _factorial(n: Bound) -> Bound:
    return None if n is None else _check(_linear(n) * max(n, 1.0))  # log10(n!) <= n log10(n); n!! <= n!


def _binomial(n: Bound, k: Bound) -> Bound:
    if n is None or k is None:
        return None
    return _check(min(_linear(n) * _LOG10_2, _linear(k) * max(n, 1.0)))  # C(n, k) <= 2^n and <= n^k


class _Bounds:
    """Recursive descent over LaTeX tokens: the :data:`Bound` of each piece, raising ``_Huge`` past the limit."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.i, self.depth = tokens, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str | None:
        tok = self.peek()
        self.i += tok is not None
        return tok

    def expression(self, closers: tuple[str, ...]) -> Bound:
        """Terms joined by additive operators and separators, up to one of ``closers`` (not consumed)."""
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _Huge
        bound: Bound = 0.0
        first = True
        while (tok := self.peek()) is not None and tok not in closers:
            if tok in _ADD or tok in _IGNORED:
                self.take()
            elif tok == "\\choose":  # {n \choose k}
                self.take()
                bound = _binomial(bound, self.term(closers))
            elif tok in _CLOSERS:  # a closer of another bracket (an interval such as [1, 2)): skip it
                self.take()
            else:
                term = self.term(closers)
                bound, first = term if first else _add(bound, term), False
        self.depth -= 1
        return bound

    def term(self, closers: tuple[str, ...]) -> Bound:
        """Factors multiplied or divided, side by side or with an operator."""
        bound: Bound = 0.0
        while (tok := self.peek()) is not None and tok not in closers and tok not in _CLOSERS \
                and tok not in _ADD and tok != "\\choose":
            if tok in _MUL or tok in _IGNORED:
                self.take()
            else:
                bound = _multiply(bound, self.postfix())
        return bound

    def postfix(self) -> Bound:
        """An atom with its superscripts, subscripts, factorials and primes."""
        bound = self.atom()
        while (tok := self.peek()) in ("^", "_", "!", "'"):
            self.take()
            if tok == "^":
                bound = _power(bound, self.operand())
            elif tok == "_":
                self.operand()  # an index, not a value
            elif tok == "!":
                bound = _factorial(bound)
        return bound

    def operand(self) -> Bound:
        """The argument of ``^``, ``_`` or a command: a group, or the next atom (a whole digit run, to be safe)."""
        while self.peek() in _IGNORED:
            self.take()
        return self.atom()

    def atom(self) -> Bound:
        tok = self.take()
        if tok is None:
            return 0.0
        if tok[0].isdigit() or tok[0] == ".":
            digits = tok.replace(".", "").lstrip("0")
            if len(digits) <= 17:
                return math.log10(int(digits)) if digits else 0.0
            return math.log10(int(digits[:17]) + 1) + len(digits) - 17
        if tok in _OPEN:
            bound = self.expression((_OPEN[tok],))
            self.take()
            return bound
        if tok in _TWO_ARGS:
            a, b = self.operand(), self.operand()
            return _binomial(a, b) if "binom" in tok else _multiply(a, b)
        if tok == "\\sqrt":
            if self.peek() == "[":
                self.take()
                self.expression(("]",))
                self.take()
            root = self.operand()
            return None if root is None else root / 2
        if tok in ("\\Gamma", "\\sum", "\\prod"):
            return self.big_operator(tok)
        if tok in _SKIP_GROUP and self.peek() == "{":
            self.take()
            self.skip_group()
        return None  # a letter, a constant, a function or another command: symbolic

    def big_operator(self, tok: str) -> Bound:
        """``\\Gamma(n)`` as ``(n-1)!``; ``\\sum``/``\\prod`` with an upper limit ``N``: ``N`` terms / factors."""
        upper: Bound = 0.0
        while self.peek() in ("_", "^"):
            if self.take() == "^":
                upper = self.operand()
            else:
                self.operand()
        body = self.postfix()
        if tok == "\\Gamma":
            return _factorial(body)
        if upper is None:
            return None
        if tok == "\\sum":  # N terms; a symbolic body has a closed form, or a loop the timer stops
            return None if body is None else _check(body + upper)
        factor = upper if body is None else max(body, 1.0)  # a symbolic factor (the index) counts as N
        return _check(_linear(upper) * max(factor, 1.0))

    def skip_group(self) -> None:
        depth = 1
        while depth and (tok := self.take()) is not None:
            depth += (tok == "{") - (tok == "}")
