"""The bundled training set ``easy-arithmetic``: seeded easy arithmetic questions and word problems, small enough
for SmolLM2-135M-Instruct to earn some reward from the start, so a first ``oar train`` on a CPU shows a rising
reward within minutes (README).

``oar train --dataset easy-arithmetic`` reads it like a file: rows ``{"problem": ..., "answer": ...}`` (the
answer as text). Three kinds, in turn: a bare sum or difference (``What is 14 + 15?``), a one-step word problem
and a two-step word problem; every value is a non-negative integer below 40.
"""

from __future__ import annotations

import random

EASY_ARITHMETIC = "easy-arithmetic"  # the --dataset name
EASY_ARITHMETIC_ROWS = 512
_NAMES = ("Tom", "Ann", "Sam", "Mia", "Ben", "Lily", "Noah", "Emma")
_ITEMS = ("apples", "pens", "books", "cards", "eggs", "coins", "stamps", "shells")


def _bare(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    if rng.random() < 0.5:
        return f"What is {a} + {b}?", a + b
    a, b = max(a, b), min(a, b)
    return f"What is {a} - {b}?", a - b


def _one_step(rng: random.Random) -> tuple[str, int]:
    n, it, a, b = rng.choice(_NAMES), rng.choice(_ITEMS), rng.randint(3, 15), rng.randint(2, 9)
    if rng.random() < 0.5:
        return f"{n} has {a} {it}. {n} gets {b} more. How many {it} does {n} have now?", a + b
    b = min(b, a - 1)
    return f"{n} has {a} {it}. {n} gives away {b}. How many {it} does {n} have now?", a - b


def _two_step(rng: random.Random) -> tuple[str, int]:
    n, it, a, b = rng.choice(_NAMES), rng.choice(_ITEMS), rng.randint(3, 15), rng.randint(2, 10)
    c = rng.randint(1, a + b - 1)
    return (f"{n} has {a} {it}. {n} buys {b} more and then gives away {c}. How many {it} does {n} have now?",
            a + b - c)


def easy_arithmetic_rows(n: int = EASY_ARITHMETIC_ROWS, seed: int = 0) -> list[dict[str, str]]:
    """``n`` rows ``{"problem", "answer"}`` (kinds in turn: bare, one-step, two-step); same (n, seed), same rows."""
    rng = random.Random(f"easy-arithmetic:{seed}")
    kinds = (_bare, _one_step, _two_step)
    rows = []
    for i in range(n):
        problem, answer = kinds[i % len(kinds)](rng)
        rows.append({"problem": problem, "answer": str(answer)})
    return rows
