"""Verification: the fast path, then math-verify in a pool of helper subprocesses (``python -m oar.grading``)
that bound every item with a timer in their own main thread; ``grade_batch`` / ``grade_answers`` / ``grade_answer``.

Every request to a helper carries an id and every reply names it: a reply left behind by a request that was
interrupted between send and receive (Ctrl-C, an exception in the caller) is discarded, never read as the next
item's verdict; a request interrupted while it was being written kills the helper (a fresh one starts).
"""

from __future__ import annotations

import atexit
import json
import logging
import numbers
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from oar.grading.extraction import (
    _fast_grade,
    clean_text,
    completion_text,
    extract_answer,
    gold_text,
    squash_spaces,
)
from oar.grading.numbers import PlainNumber, numbers_match, plain_number

DEFAULT_TIMEOUT = 2.0  # seconds of math-verify per item
MAX_TIMEOUT = 1e6  # seconds; the helper's timer overflows far above
_GRACE = 5.0  # extra seconds before the caller assumes the helper is stuck and kills it
_START_TIMEOUT = 120.0  # seconds for the helper to import math-verify and sympy

# a helper's reply to one request; _DEAD: the helper died (EOF) before replying
_EQUAL, _NOT_EQUAL, _TIMEOUT, _ERROR, _DEAD = "1", "0", "t", "e", "dead"
_RECORD = "\x1e"  # starts every request line; json.dumps escapes it inside strings, so it marks a request's start

logger = logging.getLogger(__name__)


def _verify(pred: str, gold: str) -> bool:
    """math-verify equivalence of two extracted answers (no timeout here: the caller bounds it)."""
    from math_verify import verify
    from sympy import Expr, Number

    gold_parsed, pred_parsed = _parse_cached(gold), _parse_cached(pred)
    if not gold_parsed or not pred_parsed:
        return False
    g, p = gold_parsed[0], pred_parsed[0]
    if isinstance(p, Number) and isinstance(g, Expr) and g.free_symbols:
        return False  # a number never equals an expression in free variables (sympy may take seconds)
    exact = _numbers_equal(p, g, gold)
    if exact is not None:
        return exact
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def _numbers_equal(p: Any, g: Any, gold_text: str) -> bool | None:
    """When the answer is a single finite number and so is the gold, the fast path's rule (exact unless the gold
    is written as a decimal, :func:`oar.grading.numbers.numbers_match`) in place of math-verify's rounding to 6
    decimal places; else None. The gold as written wins over sympy's reading of it (``4.5e33``)."""
    pv = _fraction_of(p)
    if pv is None:
        return None
    written = plain_number(gold_text)
    if written is not None:
        return numbers_match(PlainNumber(pv), written)
    gv = _fraction_of(g)
    if gv is None:
        return None
    # a decimal sympy computed has no written last digit: only the relative tolerance applies
    return numbers_match(PlainNumber(pv), PlainNumber(gv, unit=abs(gv) + 1 if _is_float(g) else None))


def _is_float(value: Any) -> bool:
    from sympy import Float

    return isinstance(value, Float)


def _fraction_of(value: Any) -> Fraction | None:
    """The exact rational of a sympy number (Integer, Rational, or a finite Float by its decimal digits)."""
    from sympy import Float, Rational

    if isinstance(value, Rational):
        return Fraction(int(value.p), int(value.q))
    if isinstance(value, Float) and value.is_finite:
        return Fraction(str(value))
    return None


def _parse_cached(text: str, _cache: dict[str, Any] = {}) -> Any:  # noqa: B006  (a per-process cache)
    from math_verify import parse

    if text not in _cache:
        if len(_cache) > 4096:
            _cache.clear()
        _cache[text] = parse(f"${text}$", parsing_timeout=None)
    return _cache[text]


class _Timeout(BaseException):
    """The helper's item timer: a BaseException, so math-verify's own ``except Exception`` cannot swallow it."""


def _serve() -> None:
    """Helper process loop: ``\\x1e`` + JSON ``[id, pred, gold, timeout]`` per stdin line -> ``"<id> <status>"``
    per stdout line, status ``1`` (equivalent), ``0`` (not), ``t`` (over its timeout), ``e`` (an error)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller decides when this process stops
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    _verify("1", "1")  # import and warm up math-verify before announcing readiness

    def on_alarm(signum, frame):
        raise _Timeout

    signal.signal(signal.SIGALRM, on_alarm)
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:  # the text after the last record separator: a request torn by an interrupted write is dropped
            rid, pred, gold, timeout = json.loads(line.rpartition(_RECORD)[2])
        except (ValueError, TypeError):
            continue  # not a whole request: there is no id to answer
        status = _ERROR
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                status = _EQUAL if _verify(pred, gold) else _NOT_EQUAL
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Timeout:
            status = _TIMEOUT
        except Exception:  # a parse or verify error: not equivalent, and counted
            status = _ERROR
        out.write(f"{rid} {status}\n")
        out.flush()


class _Helper:
    """The caller's side of one helper process: one request in flight at a time, with a deadline; replies to
    requests abandoned by an interruption are discarded by id."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "oar.grading"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # the caller's import path, so the helper imports the same oar and math-verify
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, sys.path))},
            start_new_session=True,  # a Ctrl-C in the caller's terminal does not reach it
        )
        self.pid_owner = os.getpid()
        self.buf = b""
        self.last_id = 0
        self.settled_by = 0.0  # monotonic time by which every abandoned request has been answered or killed
        if self._readline(time.monotonic() + _START_TIMEOUT) != "ready":
            self.close()
            raise RuntimeError("the math-verify grading helper (python -m oar.grading) failed to start")

    def _readline(self, deadline: float) -> str | None:
        """The next reply line; None at the deadline or when the helper closed its output (died)."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def _send(self, data: bytes) -> None:
        fd, view = self.proc.stdin.fileno(), memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def verify(self, pred: str, gold: str, timeout: float) -> str:
        """The helper's reply status for one item; ``_TIMEOUT`` when it overran ``timeout`` + grace (then it is
        killed), ``_DEAD`` when it had died.

        An exception at any point (KeyboardInterrupt included) leaves the helper usable: a request line torn by
        it is dropped by the helper (each request starts with a record separator, and only the text after the
        last one on a line is read), and a reply to it is discarded by id."""
        self.last_id += 1
        rid = str(self.last_id)
        data = (_RECORD + json.dumps([self.last_id, pred, gold, timeout]) + "\n").encode()
        # requests run one after another: an abandoned one may hold the helper up to its own deadline
        deadline = max(time.monotonic(), self.settled_by) + timeout + _GRACE
        try:
            self._send(data)
            while (line := self._readline(deadline)) is not None:
                reply_id, _, status = line.partition(" ")
                if reply_id == rid:
                    return status
                # a reply to an abandoned request: never this item's verdict
        except OSError:  # a broken pipe: the helper is gone
            self.close()
            return _DEAD
        except BaseException:
            self.settled_by = deadline
            raise
        dead = self.proc.poll() is not None
        self.close()
        return _DEAD if dead else _TIMEOUT

    def alive(self) -> bool:
        return self.proc.poll() is None and self.pid_owner == os.getpid()

    def close(self) -> None:
        if self.pid_owner == os.getpid() and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _default_workers() -> int:
    env = os.environ.get("OAR_GRADER_WORKERS")
    return int(env) if env else max(1, min(4, (os.cpu_count() or 1) // 4))


class _Pool:
    """``n`` lazily started helpers; each call takes one off the queue, so threads never share a helper."""

    def __init__(self, n: int) -> None:
        self.n, self.pid = n, os.getpid()
        self.slots: queue.SimpleQueue[_Helper | None] = queue.SimpleQueue()
        for _ in range(n):
            self.slots.put(None)
        self.started: list[_Helper] = []

    def run(self, pairs: list[tuple[str, str]], timeout: float) -> list[str]:
        """One reply status per pair; an item whose helper died is tried once more on a fresh helper."""
        helper = self.slots.get()
        try:
            statuses = []
            for pred, gold in pairs:
                for _attempt in range(2):
                    if helper is None or not helper.alive():  # first use, or killed after a stall
                        helper = _Helper()
                        self.started = [h for h in self.started if h.alive()] + [helper]
                    status = helper.verify(pred, gold, timeout)
                    if status != _DEAD:
                        break
                statuses.append(status)
            return statuses
        finally:
            self.slots.put(helper)

    def close(self) -> None:
        for helper in self.started:
            helper.close()


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _get_pool() -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is None or _pool.pid != os.getpid():  # first use, or a forked child: never share pipes
            _pool = _Pool(_default_workers())
        return _pool


@atexit.register
def _close_pool() -> None:
    if _pool is not None:
        _pool.close()


def _math_verify(pairs: list[tuple[str, str]], timeout: float) -> list[str]:
    """math-verify reply statuses, each item bounded by ``timeout``; identical pairs are verified once."""
    unique = list(dict.fromkeys(pairs))
    pool = _get_pool()
    shards = [unique[i :: pool.n] for i in range(min(pool.n, len(unique)))]
    if len(shards) <= 1:
        statuses = pool.run(unique, timeout)
    else:
        with ThreadPoolExecutor(len(shards)) as ex:
            done = list(ex.map(lambda shard: pool.run(shard, timeout), shards))
        statuses = [done[i % len(shards)][i // len(shards)] for i in range(len(unique))]
    lookup = dict(zip(unique, statuses, strict=True))
    return [lookup[p] for p in pairs]


def check_timeout(timeout: Any) -> float:
    """``timeout`` as seconds, or ValueError naming it: a finite number > 0 and at most :data:`MAX_TIMEOUT`."""
    ok = isinstance(timeout, numbers.Real) and not isinstance(timeout, bool) and 0 < timeout <= MAX_TIMEOUT
    if not ok:  # NaN fails every comparison
        raise ValueError(f"timeout must be a number of seconds in (0, {MAX_TIMEOUT:g}], got {timeout!r}")
    return float(timeout)


# ---------------------------------------------------------------------------------------------- grading


@dataclass
class Grades:
    """The verdicts of a batch (one bool per completion) and what went wrong while grading it: ``errors`` counts
    items whose grading raised (a gold too large to read, a math-verify failure, a bug) and ``timeouts`` items
    math-verify did not settle within the timeout (or whose helper died twice); both are graded wrong."""

    verdicts: list[bool]
    errors: int = 0
    timeouts: int = 0


_reported: set[str] = set()


def _report(err: BaseException) -> None:
    """Log a grading error: a warning the first time its type is seen in this process, then at debug level."""
    kind = type(err).__name__
    level = logging.DEBUG if kind in _reported else logging.WARNING
    _reported.add(kind)
    logger.log(level, "oar: grading an item raised %s: %.200s; it is graded wrong (counted in Grades.errors)",
                kind, err)


def _prepare(completion: Any, gold: Any) -> tuple[bool | None, str | None, str]:
    """(verdict or None when math-verify must decide, the extracted answer, the normalised gold)."""
    gold = gold_text(gold)
    if gold is None:  # a missing gold never matches
        return False, None, ""
    text = clean_text(completion_text(completion))
    pred = extract_answer(text)
    if pred is None:  # no final answer and not a plain bare answer: right only when the text is the gold
        return squash_spaces(text).strip("$").strip() == squash_spaces(gold), None, gold
    return _fast_grade(pred, gold), pred, gold


def grade_batch(
    completions: Sequence[str | Sequence[Mapping[str, Any]]],
    golds: Sequence[Any],
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> Grades:
    """Grade many completions against their gold answers: :class:`Grades`. Never raises for an item (an item
    whose grading fails is wrong and counted); ValueError for different lengths or a bad ``timeout``.

    Each completion is read through :func:`clean_text` and each gold through :func:`normalize_gold`; a missing
    gold (:func:`missing_gold`: None, NaN, empty) never matches. Extraction and the fast path are linear in
    the completion's length; items they do not settle cost at most ``timeout`` seconds of math-verify each
    (plus a few seconds when the helper must be restarted).
    """
    timeout = check_timeout(timeout)
    if len(completions) != len(golds):
        raise ValueError(f"{len(completions)} completions but {len(golds)} gold answers")
    grades = Grades([])
    verdicts: list[bool | None] = []
    slow: list[tuple[str, str]] = []
    for completion, gold in zip(completions, golds, strict=True):
        try:
            verdict, pred, gold_text = _prepare(completion, gold)
        except Exception as err:  # noqa: BLE001  (a reward must never end a run: wrong, counted, logged)
            _report(err)
            grades.errors += 1
            verdict = False
        if verdict is None:
            slow.append((pred, gold_text))
        verdicts.append(verdict)
    statuses = iter(_math_verify(slow, timeout)) if slow else iter(())
    for verdict in verdicts:
        if verdict is None:
            status = next(statuses)
            grades.errors += status == _ERROR
            grades.timeouts += status in (_TIMEOUT, _DEAD)
            verdict = status == _EQUAL
        grades.verdicts.append(verdict)
    return grades


def grade_answers(
    completions: Sequence[str | Sequence[Mapping[str, Any]]],
    golds: Sequence[Any],
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[bool]:
    """Grade many completions against their gold answers; one bool per completion (:func:`grade_batch`'s
    verdicts: an item whose grading fails is wrong, never an exception)."""
    return grade_batch(completions, golds, timeout=timeout).verdicts


def grade_answer(
    completion: str | Sequence[Mapping[str, Any]], gold: Any, *, timeout: float = DEFAULT_TIMEOUT
) -> bool:
    """Is the final answer of ``completion`` mathematically equivalent to ``gold``? (math-verify)"""
    return grade_answers([completion], [gold], timeout=timeout)[0]
