"""The grader on hostile input: bounded time on any completion, and a missing gold never matches."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from oar.grading import grade_answer, grade_answers, math_reward, missing_gold, normalize_gold

SRC = str(Path(__file__).resolve().parent.parent / "src")

# one line of 10^6 characters each: long letter runs made extraction quadratic (hours at this length)
_HOSTILE = {
    "letters": "'a' * 10**6",
    "letters then words": "'a' * 10**6 + ' bb cc'",
    "two-letter words, no newline": "'ab ' * 333_333",
    "letters and digits": "'a1' * 500_000",
    "digits": "'1' * 10**6",
    "open braces": "'\\\\boxed{' + '{' * 10**6",
    "nested boxes": "'\\\\boxed{' * 140_000",
    "answer phrases": "'the answer is a' * 60_000",
    "dollars and backslashes": "'$\\\\' * 500_000",
    "text macros": "'\\\\text{' * 160_000",
}

_PROBE = """
import json, sys, time
from oar.grading import extract_answer, grade_answer, math_reward
text = {expr}
t0 = time.perf_counter()
extract_answer(text)
grade_answer(text, "1")
math_reward(None, [text], answer=["1"])
print(json.dumps(time.perf_counter() - t0))
"""


@pytest.mark.parametrize("name", list(_HOSTILE))
def test_grading_is_bounded_on_a_million_character_line(name):
    """extract_answer + grade_answer + math_reward on a 10^6-character completion: well under a second of work
    (a generous 10 s allows for a loaded CI machine); the child process is killed at 60 s so the test fails
    rather than hangs on a super-linear path."""
    code = _PROBE.format(expr=_HOSTILE[name])
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                              env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"grading a 10^6-character {name!r} completion did not finish in 60 s")
    assert done.returncode == 0, done.stderr[-2000:]
    seconds = json.loads(done.stdout.strip().splitlines()[-1])
    assert seconds < 10.0, f"{name}: {seconds:.1f} s"


@pytest.mark.parametrize("gold", [None, "", "  ", [], float("nan"), "$ $"])
def test_a_missing_gold_never_matches(gold):
    assert missing_gold(gold)
    for completion in ("", "None", "\\boxed{None}", "\\boxed{}", "nan", "The answer is nan"):
        assert grade_answer(completion, gold) is False, (completion, gold)
    assert math_reward(None, ["\\boxed{None}", ""], answer=[gold, gold]) == [0.0, 0.0]


def test_missing_golds_do_not_shadow_present_ones():
    assert grade_answers(["\\boxed{3}", "\\boxed{3}", ""], ["3", None, ""]) == [True, False, False]
    assert not missing_gold("0") and not missing_gold(0) and not missing_gold(0.0) and not missing_gold(["1"])


def test_normalize_gold_refuses_none():
    with pytest.raises(ValueError, match="None"):
        normalize_gold(None)
    assert normalize_gold(27.0) == "27" and not math.isnan(float(normalize_gold("3.5")))
