"""Verification: the fast path, then math-verify in a pool of helper subprocesses (``python -m oar.grading``)
that bound every item with a timer in their own main thread; ``grade_answers`` / ``grade_answer``."""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from oar.grading.extraction import _fast_grade, completion_text, extract_answer, missing_gold, normalize_gold

DEFAULT_TIMEOUT = 2.0  # seconds of math-verify per item
_GRACE = 5.0  # extra seconds before the caller assumes the helper is stuck and kills it
_START_TIMEOUT = 120.0  # seconds for the helper to import math-verify and sympy


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
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def _parse_cached(text: str, _cache: dict[str, Any] = {}) -> Any:  # noqa: B006  (a per-process cache)
    from math_verify import parse

    if text not in _cache:
        if len(_cache) > 4096:
            _cache.clear()
        _cache[text] = parse(f"${text}$", parsing_timeout=None)
    return _cache[text]


class _Timeout(Exception):
    pass


def _serve() -> None:
    """Helper process loop: JSON ``[pred, gold, timeout]`` per stdin line -> ``1``/``0`` per stdout line."""
    import logging
    import signal

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    _verify("1", "1")  # import and warm up math-verify before announcing readiness

    def on_alarm(signum, frame):
        raise _Timeout

    signal.signal(signal.SIGALRM, on_alarm)
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        pred, gold, timeout = json.loads(line)
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout)
            ok = _verify(pred, gold)
            signal.setitimer(signal.ITIMER_REAL, 0)
        except Exception:  # _Timeout, or a parse/verify error: not equivalent
            signal.setitimer(signal.ITIMER_REAL, 0)
            ok = False
        out.write("1\n" if ok else "0\n")
        out.flush()


class _Helper:
    """The caller's side of the helper process: one request in flight at a time, with a deadline."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "oar.grading"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # the caller's import path, so the helper imports the same oar and math-verify
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, sys.path))},
        )
        self.pid_owner = os.getpid()
        self.buf = b""
        if self._readline(time.monotonic() + _START_TIMEOUT) != "ready":
            self.close()
            raise RuntimeError("the math-verify grading helper (python -m oar.grading) failed to start")

    def _readline(self, deadline: float) -> str | None:
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

    def verify(self, pred: str, gold: str, timeout: float) -> bool | None:
        """The helper's verdict, or None when it overran ``timeout`` + grace or died (then it is closed)."""
        try:
            self.proc.stdin.write((json.dumps([pred, gold, timeout]) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            self.close()
            return None
        line = self._readline(time.monotonic() + timeout + _GRACE)
        if line is None:
            self.close()
            return None
        return line == "1"

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

    def run(self, pairs: list[tuple[str, str]], timeout: float) -> list[bool]:
        helper = self.slots.get()
        try:
            results = []
            for pred, gold in pairs:
                if helper is None or not helper.alive():  # first use, or killed after a stall
                    helper = _Helper()
                    self.started.append(helper)
                results.append(bool(helper.verify(pred, gold, timeout)))
            return results
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


def _math_verify(pairs: list[tuple[str, str]], timeout: float) -> list[bool]:
    """math-verify verdicts, each bounded by ``timeout``; identical pairs are verified once."""
    unique = list(dict.fromkeys(pairs))
    pool = _get_pool()
    shards = [unique[i :: pool.n] for i in range(min(pool.n, len(unique)))]
    if len(shards) <= 1:
        verdicts = pool.run(unique, timeout)
    else:
        with ThreadPoolExecutor(len(shards)) as ex:
            done = list(ex.map(lambda shard: pool.run(shard, timeout), shards))
        verdicts = [done[i % len(shards)][i // len(shards)] for i in range(len(unique))]
    lookup = dict(zip(unique, verdicts, strict=True))
    return [lookup[p] for p in pairs]


# ---------------------------------------------------------------------------------------------- grading


def grade_answers(
    completions: Sequence[str | Sequence[Mapping[str, Any]]],
    golds: Sequence[Any],
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[bool]:
    """Grade many completions against their gold answers; one bool per completion.

    Each gold goes through :func:`normalize_gold`; a missing gold (:func:`missing_gold`: None, NaN, empty)
    never matches. Extraction and the fast path are linear in the completion's length; items they do not
    settle cost at most ``timeout`` seconds of math-verify each (plus a few seconds when the helper must be
    restarted).
    """
    if len(completions) != len(golds):
        raise ValueError(f"{len(completions)} completions but {len(golds)} gold answers")
    verdicts: list[bool | None] = []
    slow: list[tuple[str, str]] = []
    for completion, gold in zip(completions, golds, strict=True):
        if missing_gold(gold):
            verdicts.append(False)
            continue
        text, gold = completion_text(completion), normalize_gold(gold)
        pred = extract_answer(text)
        if pred is None:  # no final answer and not a plain bare answer: right only when the text is the gold
            verdict = "".join(text.split()).strip("$") == "".join(gold.split())
        else:
            verdict = _fast_grade(pred, gold)
        if verdict is None:
            slow.append((pred, gold))
        verdicts.append(verdict)
    slow_results = iter(_math_verify(slow, timeout)) if slow else iter(())
    return [next(slow_results) if v is None else v for v in verdicts]


def grade_answer(
    completion: str | Sequence[Mapping[str, Any]], gold: Any, *, timeout: float = DEFAULT_TIMEOUT
) -> bool:
    """Is the final answer of ``completion`` mathematically equivalent to ``gold``? (math-verify)"""
    return grade_answers([completion], [gold], timeout=timeout)[0]
