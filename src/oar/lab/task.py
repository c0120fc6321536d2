"""A seeded procedural arithmetic task with worked solutions and exact pivotal-token labels.

A problem is a left-to-right chain of additions and subtractions, e.g. prompt ``"57+8-6+9="``; its worked
solution computes one step per line and ends in the boxed answer:

    57+8=65; ok; 65-6=59; fine; 59+9=68; next; \\boxed{68}

Every character of the completion carries a label (one char = one token with the lab tokenizer):
``PIVOTAL`` (digits of operands and intermediate results: the answer is a function of them),
``STRUCTURE`` (operators, ``=``, separators), ``FILLER`` (answer-irrelevant padding, the verbosity knob),
``ANSWER`` (the final ``\\boxed{...}`` statement) and ``DISTRACTOR`` (answer-irrelevant commentary that holds
numbers, e.g. ``check 17``, the ``distractors`` knob: digits the answer never uses).

The ``phrasing`` knob writes the same chain in words (the language-model lab's option, docs/lab.md)::

    57 plus 8 is 65. ok. 65 minus 6 is 59. fine. 59 plus 9 is 68. next. So the answer is \\boxed{68}

with the same labels on the same kinds of text.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import asdict, dataclass, replace

PIVOTAL, STRUCTURE, FILLER, ANSWER, DISTRACTOR = 0, 1, 2, 3, 4
LABEL_NAMES = {PIVOTAL: "pivotal", STRUCTURE: "structure", FILLER: "filler", ANSWER: "answer",
               DISTRACTOR: "distractor"}
# answer-irrelevant commentary; no digits, so a filler never restates a value the answer could copy
FILLERS: tuple[str, ...] = (
    "ok", "fine", "next", "good", "check", "sure", "so far so good", "keep going", "looks right",
    "carry on", "right", "noted", "moving on", "all good", "step done", "easy",
)
# answer-irrelevant commentary holding a number (the number is never a value of the problem's chain)
DISTRACTORS: tuple[str, ...] = ("check {n}", "not {n}", "about {n}", "{n} is close", "maybe {n}", "skip {n}")
STEP_SEP = "; "
PHRASINGS = ("symbols", "words")
_WORDS = {"+": " plus ", "-": " minus "}  # the words phrasing's operators; "=" is " is ", the separator ". "
WORDS_SEP, WORDS_CONCLUDE = ". ", "So the answer is "
BOXED = "\\boxed{"  # opens the answer statement; also the lab's conclude text (the probe's, the trainer's)


@dataclass(frozen=True)
class TaskConfig:
    """Difficulty knobs of the arithmetic task.

    ``steps``: inclusive range of operations per problem. Operands are ``1..max_operand``; the start
    value is ``start_lo..start_hi``; every intermediate value stays in ``0..max_value``.
    ``verbosity``: filler phrases after each step (answer-irrelevant text; 0 = terse solutions).
    ``slip_rate``: probability that a step's written result is off by 1-3 (later steps continue from the
    wrong value), used only for warm-start demonstrations; problems for RL and evaluation are clean.
    ``distractors``: number-holding commentary phrases after each step (labelled ``DISTRACTOR``).
    ``phrasing``: ``"symbols"`` (``57+8=65; ``) or ``"words"`` (``57 plus 8 is 65. ``, ending ``So the answer is
    \\boxed{68}``).
    """

    min_steps: int = 2
    max_steps: int = 3
    max_operand: int = 9
    start_lo: int = 5
    start_hi: int = 25
    max_value: int = 30
    verbosity: int = 1
    slip_rate: float = 0.0
    distractors: int = 0
    phrasing: str = "symbols"

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}")
        if not 1 <= self.max_operand <= self.max_value:
            raise ValueError(f"max_operand must be in [1, max_value], got {self.max_operand}")
        if not 0 <= self.start_lo <= self.start_hi <= self.max_value:
            raise ValueError(f"need 0 <= start_lo <= start_hi <= max_value, got {self.start_lo}, {self.start_hi}")
        if self.verbosity < 0:
            raise ValueError(f"verbosity must be >= 0, got {self.verbosity}")
        if not 0.0 <= self.slip_rate < 1.0:
            raise ValueError(f"slip_rate must be in [0, 1), got {self.slip_rate}")
        if self.distractors < 0:
            raise ValueError(f"distractors must be >= 0, got {self.distractors}")
        if self.phrasing not in PHRASINGS:
            raise ValueError(f"phrasing must be one of {PHRASINGS}, got {self.phrasing!r}")

    def key_fields(self) -> dict:
        """The fields that identify the task (knobs added later count only when set, so earlier tasks, their
        splits and their cached warm starts keep their keys)."""
        return recorded_task(asdict(self))

    def key(self) -> str:
        return hashlib.sha1(repr(sorted(self.key_fields().items())).encode()).hexdigest()[:12]


_LATER_KNOBS = {"distractors": 0, "phrasing": "symbols"}


def recorded_task(task: dict) -> dict:
    """A task as a run records it (``asdict``), without the knobs added later at their defaults: what a run made
    before a knob existed recorded (a finished run it still is, under ``--resume``)."""
    return {k: v for k, v in task.items() if not (k in _LATER_KNOBS and v == _LATER_KNOBS[k])}


@dataclass(frozen=True)
class LabProblem:
    """One problem: ``prompt`` text, worked ``completion`` text, integer ``answer`` (the true one), and
    ``labels``, one per completion character (PIVOTAL / STRUCTURE / FILLER / ANSWER). With a slip the
    completion's boxed value differs from ``answer``."""

    prompt: str
    completion: str
    answer: int
    labels: tuple[int, ...]


def _expression(rng: random.Random, cfg: TaskConfig) -> tuple[int, list[tuple[str, int]]]:
    value = start = rng.randint(cfg.start_lo, cfg.start_hi)
    ops = []
    for _ in range(rng.randint(cfg.min_steps, cfg.max_steps)):
        b = rng.randint(1, cfg.max_operand)
        can_add, can_sub = value + b <= cfg.max_value, value - b >= 0
        op = rng.choice("+-") if can_add and can_sub else ("+" if can_add else "-")
        value = value + b if op == "+" else value - b
        ops.append((op, b))
    return start, ops


def _chain(rng: random.Random, cfg: TaskConfig, start: int, ops: list[tuple[str, int]]) -> list[int]:
    """Written values ``[start, r1, r2, ...]``; with slips, redrawn until every value stays in range."""
    for _ in range(50):
        values = [start]
        for op, b in ops:
            result = values[-1] + b if op == "+" else values[-1] - b
            if cfg.slip_rate and rng.random() < cfg.slip_rate:
                result += rng.choice((-3, -2, -1, 1, 2, 3))
            values.append(result)
        if all(0 <= v <= cfg.max_value for v in values):
            return values
    return _chain(rng, replace(cfg, slip_rate=0.0), start, ops)


def _solve(rng: random.Random, cfg: TaskConfig, start: int, ops: list[tuple[str, int]]) -> tuple[str, list[int]]:
    parts: list[tuple[str, int]] = []
    values = _chain(rng, cfg, start, ops)
    unused = [v for v in range(cfg.max_value + 1) if v not in set(values) | {b for _, b in ops}]
    words = cfg.phrasing == "words"
    sep = WORDS_SEP if words else STEP_SEP
    for (op, b), value, result in zip(ops, values, values[1:], strict=False):
        parts += [(str(value), PIVOTAL), (_WORDS[op] if words else op, STRUCTURE), (str(b), PIVOTAL),
                  (" is " if words else "=", STRUCTURE), (str(result), PIVOTAL), (sep, STRUCTURE)]
        for _ in range(cfg.verbosity):
            parts += [(rng.choice(FILLERS), FILLER), (sep, STRUCTURE)]
        for _ in range(cfg.distractors):
            n = rng.choice(unused)
            parts += [(rng.choice(DISTRACTORS).format(n=n), DISTRACTOR), (sep, STRUCTURE)]
    if words:
        parts.append((WORDS_CONCLUDE, STRUCTURE))
    parts.append((BOXED + str(values[-1]) + "}", ANSWER))
    text = "".join(t for t, _ in parts)
    labels = [lab for t, lab in parts for _ in t]
    return text, labels


def make_problem(rng: random.Random, cfg: TaskConfig) -> LabProblem:
    """Draw one problem (and its worked solution) from ``rng``."""
    start, ops = _expression(rng, cfg)
    answer = start
    for op, b in ops:
        answer = answer + b if op == "+" else answer - b
    prompt = str(start) + "".join(f"{op}{b}" for op, b in ops) + "="
    completion, labels = _solve(rng, cfg, start, ops)
    return LabProblem(prompt, completion, answer, tuple(labels))


def max_completion_chars(cfg: TaskConfig) -> int:
    """An upper bound on the length of any worked solution of ``cfg`` (characters = lab tokens)."""
    digits = len(str(cfg.max_value))
    words = cfg.phrasing == "words"
    sep = len(WORDS_SEP if words else STEP_SEP)
    ops = max(map(len, _WORDS.values())) + len(" is ") if words else 2
    step = 2 * digits + len(str(cfg.max_operand)) + ops + sep
    step += cfg.verbosity * (max(map(len, FILLERS)) + sep)
    step += cfg.distractors * (max(len(d.format(n=cfg.max_value)) for d in DISTRACTORS) + sep)
    return cfg.max_steps * step + (len(WORDS_CONCLUDE) if words else 0) + len(BOXED) + digits + 1


def make_split(cfg: TaskConfig, split: str, n: int, seed: int = 0) -> list[LabProblem]:
    """``n`` problems of ``split`` ("train" or "test"); the splits never share a prompt.

    A prompt belongs to "test" iff a hash of it falls in a fixed 1/8 bucket, so the splits stay disjoint
    for every seed and size. Same (cfg, split, n, seed) -> same problems.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"{split}:{seed}:{cfg.key()}")
    out: list[LabProblem] = []
    while len(out) < n:
        p = make_problem(rng, cfg)
        if is_test_prompt(p.prompt) == (split == "test"):
            out.append(p)
    return out


def is_test_prompt(prompt: str) -> bool:
    """The fixed split rule: a prompt is held out iff its hash lands in bucket 0 of 8."""
    return hashlib.md5(prompt.encode()).digest()[0] % 8 == 0


# one written step "a±b=c" (groups: a, sign, b, c) and one operation of a prompt ("±b"); in words, "a plus b is c"
STEP_RE = re.compile(r"(\d+)([+-])(\d+)=(\d+)")
WORDS_STEP_RE = re.compile(r"(\d+) (plus|minus) (\d+) is (\d+)")
OP_RE = re.compile(r"([+-])(\d+)")


def written_steps(text: str) -> list[re.Match]:
    """The written steps of ``text`` in order, in either phrasing (``a±b=c`` or ``a plus b is c``); groups 1-4 of
    each match are a, the operator, b and c."""
    return sorted([*STEP_RE.finditer(text), *WORDS_STEP_RE.finditer(text)], key=lambda m: m.start())


def lab_prompt(text: str) -> str:
    """The lab prompt (``57+8-6+9=``) inside ``text`` (e.g. a chat-template prompt: its last such chain), else
    ``text`` itself."""
    found = re.findall(r"\d+(?:[+-]\d+)+=", text)
    return found[-1] if found else text


def first_wrong_step(prompt: str, completion: str) -> tuple[int, int] | None:
    """Character span ``[start, end)`` of the first wrong step of a lab completion, or None.

    A step ``a±b=c`` is wrong when ``a`` is not the previous step's written result (the prompt's start value
    for the first step), ``±b`` is not the prompt's operation at that position, or ``c != a ± b``. None when
    every written step is right (the error, if any, is elsewhere: a missing step or the boxed value) or the
    prompt does not parse.
    """
    head = re.match(r"(\d+)", prompt)
    if head is None:
        return None
    value, ops = int(head.group(1)), OP_RE.findall(prompt[head.end():])
    for i, m in enumerate(written_steps(completion)):
        a, op, b, c = int(m.group(1)), {"plus": "+", "minus": "-"}.get(m.group(2), m.group(2)), int(m.group(3)), \
            int(m.group(4))
        expected_op = ops[i] if i < len(ops) else None
        right = (a == value and expected_op == (op, str(b)) and c == (a + b if op == "+" else a - b))
        if not right:
            return m.start(), m.end()
        value = c
    return None


def step_digit_positions(text: str) -> list[int]:
    """Character positions of the digits of every written step ``a±b=c`` in ``text`` (operands and results: the
    tokens the answer is computed from, the ``PIVOTAL`` label of a worked solution, for any sampled text)."""
    return [i for m in written_steps(text) for g in (1, 3, 4) for i in range(m.start(g), m.end(g))]


# the role of each character of a worked solution, finer than the labels: pivotal digits split by their role in a±b=c
TOKEN_KINDS = ("result", "copied", "operand", "structure", "filler", "answer")


def token_kinds(completion: str, labels: tuple[int, ...]) -> list[str]:
    """One kind per character of a worked solution (``TOKEN_KINDS``): pivotal digits become ``copied`` (``a``),
    ``operand`` (``b``) or ``result`` (``c``) of their step ``a±b=c``; the other labels keep their names."""
    names = {STRUCTURE: "structure", FILLER: "filler", ANSWER: "answer", PIVOTAL: "pivotal"}
    kinds = [names.get(lab, "other") for lab in labels]
    for m in STEP_RE.finditer(completion):
        for group, role in ((1, "copied"), (3, "operand"), (4, "result")):
            for i in range(m.start(group), m.end(group)):
                kinds[i] = role
    return kinds


def steps_from_end(completion: str, width: int) -> list[int]:
    """``width`` entries: for each character of the completion the distance of its step from the answer (1 = the
    last written step), 0 outside any step and past the completion."""
    out = [0] * width
    spans = [m.span() for m in STEP_RE.finditer(completion)]
    for k, (lo, hi) in enumerate(spans):
        out[lo:hi] = [len(spans) - k] * (hi - lo)
    return out[:width]


def failure_kind(prompt: str, completion: str, answer: int) -> str:
    """Why a lab completion fails: ``right``; for the first wrong step (:func:`first_wrong_step`): ``step skipped``
    (it does the next operation), ``extra step`` (past the prompt's operations), ``wrong a`` (not the previous
    result), ``wrong b`` (not the prompt's operation) or ``wrong c`` (a slip in the result); ``steps right, box
    wrong`` (every written step right: a step missing at the end, or the boxed value not the last result) or ``no
    boxed answer``."""
    if extract_int(completion) == answer:
        return "right"
    span = first_wrong_step(prompt, completion)
    if span is None:
        return "steps right, box wrong" if extract_int(completion) is not None else "no boxed answer"
    m = STEP_RE.match(completion, span[0])
    head = re.match(r"(\d+)", prompt)
    ops = OP_RE.findall(prompt[head.end():])
    steps_before = len(STEP_RE.findall(completion[: span[0]]))
    prev = int(head.group(1)) if steps_before == 0 else int(STEP_RE.findall(completion[: span[0]])[-1][3])
    a, op, b = int(m.group(1)), m.group(2), str(int(m.group(3)))
    ops = [(o, str(int(n))) for o, n in ops]
    if steps_before >= len(ops):
        return "extra step"
    if (op, b) != ops[steps_before]:
        return "step skipped" if ops[steps_before + 1 : steps_before + 2] == [(op, b)] else "wrong b"
    if a != prev:
        return "wrong a"
    return "wrong c"


def extract_int(completion: str) -> int | None:
    """The integer in the completion's last ``\\boxed{}`` (via the shared answer locator), or None."""
    from oar.answer_span import locate_answer

    span = locate_answer(completion)
    if span is None:
        return None
    text = span.answer(completion)
    return int(text) if text.lstrip("-").isdigit() else None


def lab_reward(completions: list, answer: list[int], **_) -> list[float]:
    """Binary exact-match reward in TRL's reward-function signature: 1.0 iff the boxed integer is right.
    A completion is a text or, for chat prompts, TRL's message list (its last message's content is read)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(extract_int(c) == int(a)) for c, a in zip(texts, answer, strict=True)]
