"""The math-verify helper's request/reply matching: no verdict is ever another item's, whatever interrupts a request
(KeyboardInterrupt between send and receive, a torn request line, a bad timeout, a helper that dies)."""

from __future__ import annotations

import math
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oar.grading.verify as grading  # the helper pool's internals: faults are injected into them
from oar.grading import grade_answer, grade_answers, grade_batch
from oar.grading.extraction import _fast_grade, extract_answer

# items the fast path cannot settle: every verdict comes from the helper, half of them True
ITEMS = [
    ("\\boxed{x+3}", "3+x"), ("\\boxed{x^2+0}", "x^2"), ("\\boxed{x+1}", "1+x"), ("\\boxed{x+5}", "x"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"), ("\\boxed{(x+1)^2}", "x^2+2x+1"), ("\\boxed{x^2-1}", "(x-1)^2"),
    ("\\boxed{\\{1, 2\\}}", "\\{2,1\\}"), ("\\boxed{\\{1, 2\\}}", "\\{1,2,3\\}"), ("\\boxed{[1, 2)}", "(1,2]"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{1}{2}\\sqrt3"), ("\\boxed{2\\pi}", "\\pi+\\pi+1"),
]
SLOW = 20.0  # seconds per item: a loaded test machine must not turn a verdict into a timeout
FAULTS = ("none", "before_send", "torn_send", "after_send", "after_read", "bad_timeout")


class Interrupt(KeyboardInterrupt):
    """The injected interruption (a KeyboardInterrupt, as Ctrl-C raises)."""


@pytest.fixture(scope="module")
def expected():
    """Each item graded alone, single-threaded, by a fresh helper pool."""
    assert all(_fast_grade(extract_answer(c), g) is None for c, g in ITEMS), "an item would not reach the helper"
    pool = grading._Pool(1)
    try:
        verdicts = [grading._EQUAL == pool.run([(extract_answer(c), g)], SLOW)[0] for c, g in ITEMS]
    finally:
        pool.close()
    assert any(verdicts) and not all(verdicts)
    return verdicts


@pytest.fixture(scope="module")
def shared_pool():
    pool = grading._Pool(1)
    yield pool
    pool.close()


class Faults:
    """Patches the helper's send and receive so the next request is interrupted at a chosen point."""

    def __init__(self, mp: pytest.MonkeyPatch) -> None:
        self.armed: str | None = None
        send, readline = grading._Helper._send, grading._Helper._readline

        def faulty_send(helper, data):
            fault, self.armed = self.armed, None
            if fault == "before_send":
                raise Interrupt
            if fault == "torn_send":  # part of the request line reaches the helper, then the caller is interrupted
                os.write(helper.proc.stdin.fileno(), data[: len(data) // 2])
                raise Interrupt
            send(helper, data)
            if fault == "after_send":
                raise Interrupt
            if fault == "after_read":
                self.armed = "read"

        def faulty_readline(helper, deadline):
            line = readline(helper, deadline)
            if self.armed == "read":  # the reply was read off the pipe, then the caller is interrupted
                self.armed = None
                raise Interrupt
            return line

        mp.setattr(grading._Helper, "_send", faulty_send)
        mp.setattr(grading._Helper, "_readline", faulty_readline)


@settings(max_examples=30, deadline=None)
@given(steps=st.lists(st.tuples(st.lists(st.integers(0, len(ITEMS) - 1), min_size=1, max_size=3),
                                st.sampled_from(FAULTS), st.booleans()), min_size=3, max_size=8))
def test_every_verdict_is_its_own_items_under_interruptions(expected, shared_pool, steps):
    """Random sequences of single items and batches, each maybe interrupted at a random point of its first
    request (before or half-way through the send, between send and receive, after the reply was read) or given a
    NaN timeout, from the main thread or a worker thread: every verdict returned equals the item's own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grading, "_pool", shared_pool)  # one helper, across examples: every request reuses it
        faults = Faults(mp)
        for indices, fault, threaded in steps:
            completions, golds = [ITEMS[i][0] for i in indices], [ITEMS[i][1] for i in indices]
            timeout = math.nan if fault == "bad_timeout" else SLOW
            faults.armed = None if fault in ("none", "bad_timeout") else fault

            def grade(c=completions, g=golds, t=timeout):
                return grade_answers(c, g, timeout=t)

            try:
                if threaded:
                    with ThreadPoolExecutor(1) as ex:
                        verdicts = ex.submit(grade).result()
                else:
                    verdicts = grade()
            except (Interrupt, ValueError):
                assert fault != "none"
                continue
            assert fault == "none", f"the {fault} fault did not interrupt the request"
            assert verdicts == [expected[i] for i in indices], (indices, fault)
        # whatever happened before, the same helper answers every item rightly
        helper = shared_pool.slots.get()
        shared_pool.slots.put(helper)
        assert grade_answers([c for c, _ in ITEMS], [g for _, g in ITEMS], timeout=SLOW) == expected
        again = shared_pool.slots.get()
        shared_pool.slots.put(again)
        assert helper is None or again is helper, "an interruption restarted the helper"


def test_the_issue_reproduction_gives_each_items_verdict():
    grade_answer(r"\boxed{x+3}", "3+x")
    with ThreadPoolExecutor() as ex:
        err = ex.submit(grade_answer, r"\boxed{x^2+0}", "x^2", timeout=float("nan")).exception()
    assert isinstance(err, ValueError) and "nan" in str(err)
    assert grade_answer(r"\boxed{x+1}", "1+x", timeout=SLOW) is True
    assert grade_answer(r"\boxed{x+5}", "x", timeout=SLOW) is False


@pytest.mark.parametrize("timeout", [math.nan, math.inf, -math.inf, 0, -1, 0.0, "2", None, True, 1e7, [1]])
def test_a_bad_timeout_is_refused_in_one_line_naming_it(timeout):
    for call in (lambda: grade_answer("\\boxed{1}", "1", timeout=timeout),
                 lambda: grade_answers(["\\boxed{1}"], ["1"], timeout=timeout),
                 lambda: grade_batch(["\\boxed{1}"], ["1"], timeout=timeout)):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert "\n" not in message and "timeout" in message and repr(timeout) in message


@pytest.mark.parametrize("timeout", [0.5, 2, 3.0, 10**6])
def test_good_timeouts_are_accepted(timeout):
    assert grade_answer("\\boxed{3}", "3", timeout=timeout) is True
    grades = grade_batch(["\\boxed{2\\sqrt{2}}"], ["\\sqrt{8}"], timeout=timeout)  # reaches the helper
    assert grades.verdicts == [True] or (timeout < SLOW and grades.timeouts == 1)  # 0.5 s on a loaded machine


def test_a_helper_that_died_is_replaced_and_the_item_retried(monkeypatch):
    """A helper killed from outside (OOM killer, a crash) costs a restart, not a wrong verdict."""
    monkeypatch.setattr(grading, "_pool", grading._Pool(1))
    try:
        assert grade_answer("\\boxed{2\\sqrt{2}}", "\\sqrt{8}")
        helper = grading._pool.slots.get()
        grading._pool.slots.put(helper)
        helper.proc.kill()
        helper.proc.wait()
        grades = grade_batch(["\\boxed{(x+1)^2}", "\\boxed{x^2-1}"], ["x^2+2x+1", "(x-1)^2"], timeout=SLOW)
        assert grades.verdicts == [True, False] and grades.timeouts == 0
        fresh = grading._pool.slots.get()
        grading._pool.slots.put(fresh)
        assert fresh is not helper and fresh.alive()
    finally:
        grading._pool.close()


def test_a_terminal_ctrl_c_does_not_reach_the_helper(monkeypatch):
    """The helper runs in its own session: the SIGINT a terminal sends to the caller's process group misses it."""
    monkeypatch.setattr(grading, "_pool", grading._Pool(1))
    try:
        assert grade_answer("\\boxed{x+3}", "3+x")
        helper = grading._pool.slots.get()
        grading._pool.slots.put(helper)
        assert os.getpgid(helper.proc.pid) != os.getpgid(0)
        os.kill(helper.proc.pid, signal.SIGINT)  # even one sent to it directly is ignored
        assert grade_answer("\\boxed{x+5}", "x", timeout=SLOW) is False
        assert grade_answer("\\boxed{x+1}", "1+x", timeout=SLOW) is True
        assert helper.alive()
    finally:
        grading._pool.close()


def test_timeouts_and_errors_are_counted_not_raised(monkeypatch):
    monkeypatch.setattr(grading, "_GRACE", 0.5)
    monkeypatch.setattr(grading, "_pool", grading._Pool(1))
    try:
        grade_answer("\\boxed{1}", "\\frac{2}{2}+x-x")  # helper started
        helper = grading._pool.slots.get()
        grading._pool.slots.put(helper)
        os.kill(helper.proc.pid, signal.SIGSTOP)  # a helper that never answers: its item times out
        grades = grade_batch(["\\boxed{2\\sqrt{2}}", "\\boxed{3}"], ["\\sqrt{8}", "3"], timeout=0.5)
        assert grades.verdicts == [False, True] and grades.timeouts == 1 and grades.errors == 0
    finally:
        grading._pool.close()
