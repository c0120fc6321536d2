"""The one grader: answer extraction, gold normalisation, math-verify equivalence and TRL rewards.

Grading runs in two stages. A cheap in-process fast path settles exact matches and plain numbers (GSM8K,
AIME, AMC answers: leading zeros, "27.0", thousands commas, percentages, trailing units). Everything else
goes to math-verify in a helper subprocess (``python -m oar.grading``) that bounds every item with a
timer in its own main thread, so grading is safe from any thread or process of the caller, and the
caller kills and restarts the helper when an item overruns its deadline (e.g. stuck in C code).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from oar.answer_span import locate_answer

DEFAULT_TIMEOUT = 2.0  # seconds of math-verify per item
MAX_ANSWER_CHARS = 1000  # longer extracted answers are only compared as strings
_GRACE = 5.0  # extra seconds before the caller assumes the helper is stuck and kills it
_START_TIMEOUT = 120.0  # seconds for the helper to import math-verify and sympy

# ---------------------------------------------------------------------------------------------- extraction

# three words in a row; a match starts only at the start of a run of letters and the quantifiers are possessive,
# so the search is linear in the text (a 10^6-letter line takes milliseconds, not hours)
_PROSE = re.compile(r"(?<![A-Za-z])[A-Za-z]{2,}+\s++[A-Za-z]{2,}+\s++[A-Za-z]{2,}")
_TEXT = re.compile(r"\\(?:text|mathrm|mbox)\{[^{}]*\}")


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The text of a completion: a string, or TRL's conversational form (a list of message dicts)."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content") or "") for m in completion if m.get("role") in (None, "assistant"))


def extract_answer(text: str) -> str | None:
    """Final answer of a completion: the last ``\\boxed{...}``, else a final "answer is ..." / "#### ...".

    A single line without any marker and not prose (three words in a row) is taken as a bare answer.
    None when nothing is found (also for a completion cut off inside its last box).
    """
    span = locate_answer(text)
    if span is not None:
        return span.answer(text)
    bare = text.strip().strip("$").strip()
    if not bare or "\n" in bare or "\\boxed" in bare or _PROSE.search(_TEXT.sub("", bare)):
        return None
    return bare



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


# ---------------------------------------------------------------------------------------------- math-verify


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


# ---------------------------------------------------------------------------------------------- public API


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
        if pred is None:  # no answer marker: right only when the whole text is the answer
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


def math_reward(
    prompts: Sequence[Any] | None,
    completions: Sequence[str | Sequence[Mapping[str, Any]]],
    answer: Sequence[Any] | None = None,
    *,
    answer_key: str = "answer",
    **kwargs: Any,
) -> list[float]:
    """TRL reward function: 1.0 when the completion's final answer equals the gold answer, else 0.0.

    Use directly as ``reward_funcs=[math_reward]`` on a dataset with an ``answer`` column (raw GSM8K
    solutions are fine), or :func:`make_math_reward` for another column name.
    """
    golds = answer if answer_key == "answer" else kwargs.get(answer_key)
    if golds is None:
        raise ValueError(f"math_reward needs the gold answers in the dataset column {answer_key!r}")
    return [float(ok) for ok in grade_answers(completions, golds)]


def make_math_reward(answer_key: str) -> Callable[..., list[float]]:
    """:func:`math_reward` reading the gold answers from column ``answer_key`` (a named function, for TRL)."""

    def reward(prompts, completions, **kwargs):
        return math_reward(prompts, completions, answer_key=answer_key, **kwargs)

    reward.__name__ = f"math_reward_{answer_key}"
    return reward


def format_reward(
    prompts: Sequence[Any] | None, completions: Sequence[str | Sequence[Mapping[str, Any]]], **kwargs: Any
) -> list[float]:
    """TRL reward function: 1.0 when the completion states its answer in a closed ``\\boxed{...}``."""
    spans = (locate_answer(completion_text(c), phrases=()) for c in completions)
    return [float(span is not None) for span in spans]


if __name__ == "__main__":
    _serve()
