"""The grader's exactness: integers and rationals compare exactly (a tolerance only against a decimal gold), digits
are never joined across white space, invisible characters, vulgar fractions and superscripts are read as what
they print, huge numbers cost nothing and crash nothing, and a grading error is a counted 0 reward."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oar.grading import clean_text, grade_answer, grade_answers, grade_batch, math_reward, normalize_gold
from oar.grading.numbers import numbers_match, plain_number, tolerance, too_costly

SLOW = 20.0  # seconds of math-verify per item: a loaded test machine must not turn a True into a timeout

# ---------------------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("pred, gold, expected", [
    ("\\boxed{1234568}", "1234567", False), ("\\boxed{1234567}", "1234567", True),
    ("\\boxed{123456789012345678901234567890}", "123456789012345678901234567891", False),
    ("\\boxed{123456789012345678901234567890}", "123,456,789,012,345,678,901,234,567,890", True),
    ("\\boxed{1{,}000{,}001}", "1000000", False), ("\\boxed{10,\\!080}", "10080", True),
    ("\\boxed{1\\,000\\,001}", "1000001", True), ("\\boxed{-1234567}", "-1234568", False),
    ("\\boxed{-1,234,567}", "-1234567", True), ("\\boxed{1234567.0}", "1234567", True),
    ("\\boxed{1234567.0000001}", "1234567", False),  # an exact gold: no tolerance
    ("\\boxed{\\frac{1}{3}}", "\\frac{2}{6}", True), ("\\boxed{\\frac{333333}{1000000}}", "\\frac13", False),
    ("\\boxed{0.3333333}", "\\frac13", False), ("\\boxed{0.5}", "\\frac12", True),
    ("\\boxed{0.5000001}", "\\frac12", False), ("\\boxed{-\\frac{7}{3}}", "\\frac{-7}{3}", True),
    ("\\boxed{\\frac{7}{-3}}", "-\\frac{7}{3}", True), ("\\boxed{\\frac{7}{-3}}", "\\frac{7}{3}", False),
    ("\\boxed{\\frac{" + "9" * 400 + "}{1}}", "9" * 400, True),
    ("\\boxed{\\frac{" + "9" * 400 + "}{1}}", "9" * 399 + "8", False),
    ("\\boxed{" + "9" * 400 + "}", "1" + "0" * 400, False),
    ("\\boxed{2^{64}}", "18446744073709551616", True), ("\\boxed{2^{64}}", "18446744073709551617", False),
    ("\\boxed{50\\%}", "\\frac12", True), ("\\boxed{33\\%}", "\\frac13", False),
    # decimal golds: within a relative 1e-6 and half a unit of the last written digit
    ("\\boxed{3.14159265}", "3.14159", True), ("\\boxed{3.1416}", "3.14159", False),
    ("\\boxed{1234568.5}", "1234567.5", False), ("\\boxed{1234567.52}", "1234567.5", True),
    ("\\boxed{0.0000002}", "0.0000001", False), ("\\boxed{\\frac{1}{3}}", "0.333333", True),
    ("\\boxed{\\frac{1}{3}}", "0.33", False), ("\\boxed{4.5000001 \\times 10^{33}}", "4.5e33", True),
    ("\\boxed{4.6 \\times 10^{33}}", "4.5e33", False), ("\\boxed{1.5 \\cdot 10^3}", "1500", True),
    # single numbers math-verify parses (not plain): the same rule, not math-verify's 6-decimal rounding
    ("\\boxed{1\\frac{1}{2}}", "1.5000001", False), ("\\boxed{1\\frac{1}{2}}", "1.5", True),
])
def test_integers_and_rationals_compare_exactly(pred, gold, expected):
    assert grade_answer(pred, gold, timeout=SLOW) is expected


@settings(max_examples=200, deadline=None)
@given(a=st.integers(-10**40, 10**40), delta=st.integers(-3, 3).filter(bool), commas=st.booleans())
def test_integers_differing_in_any_digit_never_match(a, delta, commas):
    def written(n: int) -> str:
        return f"{n:,}" if commas else str(n)

    assert numbers_match(plain_number(written(a)), plain_number(str(a)))
    assert not numbers_match(plain_number(written(a + delta)), plain_number(str(a)))


@settings(max_examples=200, deadline=None)
@given(p=st.integers(-10**12, 10**12), q=st.integers(1, 10**6), r=st.integers(-10**12, 10**12),
       s=st.integers(1, 10**6))
def test_fractions_match_exactly_when_equal(p, q, r, s):
    a, b = plain_number(f"\\frac{{{p}}}{{{q}}}"), plain_number(f"{r}/{s}" if r >= 0 else f"-{-r}/{s}")
    assert numbers_match(a, b) == (Fraction(p, q) == Fraction(r, s))


@settings(max_examples=200, deadline=None)
@given(whole=st.integers(-10**9, 10**9), decimals=st.text("0123456789", min_size=1, max_size=8),
       shift=st.integers(-3, 3), extra=st.text("0123456789", max_size=4))
def test_a_decimal_gold_never_matches_an_answer_a_digit_away(whole, decimals, shift, extra):
    """Whatever its size, a decimal gold matches answers within half a unit of its last written digit at most:
    one unit (or more) away is wrong; more digits that leave the value unchanged are right."""
    k = len(decimals)
    gold = plain_number(f"{whole}.{decimals}")
    n = abs(whole) * 10**k + int(decimals)
    n = (-n if whole < 0 else n) + shift

    def written(m: int, tail: str = "") -> str:
        return f"{'-' if m < 0 else ''}{abs(m) // 10**k}.{abs(m) % 10**k:0{k}d}{tail}"

    assert gold.unit == Fraction(1, 10**k)
    assert numbers_match(plain_number(written(n)), gold) == (shift == 0)
    assert numbers_match(plain_number(written(n - shift, "0" * len(extra))), gold)
    pred = plain_number(written(n - shift, extra))  # digits past the gold's last one
    tol = tolerance(pred.value, gold.value, gold.unit)
    assert tol <= gold.unit / 2 and tol <= max(abs(pred.value), abs(gold.value)) / 10**6
    assert numbers_match(pred, gold) == (abs(pred.value - gold.value) <= tol)


def test_normalize_gold_keeps_every_digit():
    assert normalize_gold(2**70 + 1) == "1180591620717411303425"
    assert normalize_gold(10**5000) == "1" + "0" * 5000  # past Python's 4300-digit str() limit
    assert normalize_gold("123456789012345678901234567890.0") == "123456789012345678901234567890.0"
    assert normalize_gold("12345678901234.0") == "12345678901234" and normalize_gold(-3.0) == "-3"
    with pytest.raises(ValueError, match="finite"):
        normalize_gold(float("inf"))


# ---------------------------------------------------------------------------------------------- what is read


@pytest.mark.parametrize("pred, gold, expected", [
    ("4\n2", "42", False), ("4 2", "42", False), ("4\t2", "42", False), ("\\boxed{4 2}", "42", False),
    ("\\boxed{4 2}", "6", False), ("\\boxed{4\\quad 2}", "42", False), ("\\boxed{4~2}", "42", False),
    ("\\boxed{4\\ 2}", "8", False), ("The answer is 1 000 000", "1000000", False), ("4\u00a02", "42", False),
    ("\\boxed{x = 4 2}", "42", False), ("\\boxed{4 2}", "4 2", True),  # the same text is the same answer
    ("\\boxed{\\frac 1 2}", "0.5", True), ("\\boxed{ 42 }", "42", True), ("\\boxed{x + 1}", "1+x", True),
    ("\\boxed{2 x}", "2x", True), ("\\boxed{1\\,000}", "1000", True),
])
def test_digits_are_never_joined_across_white_space(pred, gold, expected):
    assert grade_answer(pred, gold, timeout=SLOW) is expected


@pytest.mark.parametrize("pred, gold, expected", [
    ("\\boxed{1\x00}", "1", True), ("\\boxed{1\x002}", "12", True), ("1\x00", "1", True),
    ("\\boxed{\x1b[31m7\x1b[0m}", "7", False),  # an escape sequence leaves its printable part: "[31m7[0m"
    ("\\boxed{1\u200b2}", "12", True), ("\ufeff\\boxed{5}", "5", True), ("\\boxed{\x007}", "1", False),
    ("\\boxed{½}", "\\frac12", True), ("\\boxed{½}", "0.5", True), ("\\boxed{¾}", "\\frac{3}{4}", True),
    ("\\boxed{⅓}", "0.333", False), ("\\boxed{1½}", "\\frac32", True), ("\\boxed{⅒}", "0.1", True),
    ("x²", "x^2", True), ("\\boxed{x²}", "x^2", True), ("\\boxed{10³}", "1000", True),
    ("\\boxed{x²³}", "x^{23}", True), ("\\boxed{x⁻¹}", "\\frac{1}{x}", True), ("\\boxed{2¹⁰}", "1024", True),
    ("\\boxed{x²}", "x^3", False), ("\\boxed{−3}", "-3", True), ("\\boxed{3}", "−3", False),
    ("\\boxed{1⁄2}", "0.5", True), ("\\boxed{(-∞, 3]}", "(-\\infty, 3]", True),
])
def test_invisible_characters_fractions_and_superscripts_read_as_printed(pred, gold, expected):
    assert grade_answer(pred, gold, timeout=SLOW) is expected


def test_clean_text():
    assert clean_text("a\x00b\x07c\u200bd\u202ee") == "abcde"
    assert clean_text("x² + y₁ + ½ − 10⁻³") == "x^{2} + y_{1} + \\frac{1}{2} - 10^{-3}"
    assert clean_text("\t\n plain ascii $x^2$") == "\t\n plain ascii $x^2$"
    long = "½x²\x00" * 100_000
    t0 = time.perf_counter()
    assert len(clean_text(long)) == 100_000 * len("\\frac{1}{2}x^{2}")
    assert time.perf_counter() - t0 < 5


# ---------------------------------------------------------------------------------------------- cost


ADVERSARIAL = [
    "(9^9)^(9^9)", "(99999999)!", "\\binom{10^9}{10^8}", "{10^9 \\choose 10^8}", "9^{9^{9^{9}}}", "2^{2^{2^{2^{2}}}}",
    "\\left(9^{9}\\right)^{\\left(9^{9}\\right)}", "10^{10^{10}}", "100000!", "9000!!", "99!!!!", "((9!)!)!",
    "\\Gamma(10^{6})", "\\prod_{i=1}^{10^{6}} i", "(x+1)^{10^{9}}", "2^{-10^{9}}", "3000!",
    "\\dbinom{10^6}{5 \\cdot 10^5}",
    "(10^{5})!", "2^{123456789}", "x^{100000}",
]


@pytest.mark.parametrize("answer", ADVERSARIAL)
def test_huge_integers_are_refused_before_evaluation(answer):
    assert too_costly(answer)


@pytest.mark.parametrize("pred, gold", [
    ("2^{2023}", "2^{2024}/2"), ("2023!", "2023 \\cdot 2022!"), ("x^{2023}", "x^{2022} \\cdot x"),
    ("\\binom{20000}{10000}", "\\binom{20000}{10000}+0"), ("\\binom{10^9}{2}", "\\binom{10^9}{2}"),
    ("\\frac{2 \\pi c^{2} R^{2}}{\\lambda^{5}[e^{h c /(\\lambda k T)}-1] d^{2}}", "x"), ("(-\\infty, 3]", "[1, 2)"),
])
def test_large_but_cheap_answers_still_reach_math_verify(pred, gold):
    assert not too_costly(pred) and not too_costly(gold)


def test_adversarial_answers_cost_no_timeout_and_crash_nothing():
    """Each of them used to cost the timeout plus a helper restart (7.5 s each at the default timeout)."""
    grade_answer("\\boxed{x+1}", "1+x")  # helper started
    completions = [f"\\boxed{{{a}}}" for a in ADVERSARIAL]
    t0 = time.perf_counter()
    grades = grade_batch(completions, ["1"] * len(completions))
    assert grades.verdicts == [False] * len(completions) and grades.timeouts == 0 and grades.errors == 0
    assert time.perf_counter() - t0 < 2.0  # none reaches math-verify: no 2 s timeout, no restart
    t0 = time.perf_counter()
    assert grade_answers(["\\boxed{1}"] * 3, ["(9^9)^(9^9)", "(99999999)!", "\\binom{10^9}{10^8}"]) == [False] * 3
    assert time.perf_counter() - t0 < 2.0  # huge golds too


# ---------------------------------------------------------------------------------------------- no crash


HUGE_GOLDS = [10**5000, 10**400, "1" + "0" * 5000, 1e308, "\\frac{" + "9" * 400 + "}{1}", ["9" * 5000], 2**70 + 1]


@pytest.mark.parametrize("gold", HUGE_GOLDS, ids=lambda g: type(g).__name__)
def test_huge_answers_and_golds_never_raise(gold):
    completions = ["\\boxed{\\frac{" + "9" * 400 + "}{1}}", "\\boxed{1e400}", "\\boxed{" + "9" * 5000 + "}",
                   "\\boxed{1.5e-999999999}", "\\boxed{\\frac{1}{" + "0" * 500 + "}}", "\\boxed{10^{400}}"]
    grades = grade_batch(completions, [gold] * len(completions), timeout=SLOW)
    assert grades.errors == 0 and grades.timeouts == 0
    expected = [normalize_gold(gold) in ("9" * 400, "\\frac{" + "9" * 400 + "}{1}"), gold == 10**400,
                normalize_gold(gold) == "9" * 5000, False, False, gold == 10**400]
    assert grades.verdicts == expected
    assert math_reward(None, ["\\boxed{" + normalize_gold(gold) + "}"], answer=[gold]) == [1.0]


def test_the_issue_overflow_is_a_zero_reward():
    assert math_reward(None, [r"\boxed{\frac{" + "9" * 400 + "}{1}}"], answer=["1"]) == [0.0]


def test_a_grading_error_is_a_zero_reward_counted_in_a_metric(monkeypatch, caplog):
    import logging

    import oar.grading.extraction as extraction

    caplog.set_level(logging.DEBUG, logger="oar.grading.verify")
    real = extraction.normalize_gold

    def flaky(gold):
        if gold == "boom":
            raise OverflowError("integer division result too large for a float")
        return real(gold)

    monkeypatch.setattr(extraction, "normalize_gold", flaky)
    logged: list[tuple[str, float]] = []
    rewards = math_reward(None, ["\\boxed{1}", "\\boxed{1}", "\\boxed{2}"], answer=["1", "boom", "boom"],
                          log_metric=lambda name, value: logged.append((name, value)))
    assert rewards == [1.0, 0.0, 0.0]
    assert ("grading/errors", 2.0) in logged and ("grading/timeouts", 0.0) in logged
    assert "OverflowError" in caplog.text
    assert grade_batch(["\\boxed{1}"], ["boom"]).errors == 1
