"""The bundled training set ``easy-arithmetic``: seeded one-step arithmetic questions and word problems on single
digits, easy enough for SmolLM2-135M-Instruct to earn some reward from the start, so a first ``oar train`` on a CPU
shows a rising reward within minutes (README; ``recipes/smollm2-easy-arithmetic.yaml``).

``oar train --dataset easy-arithmetic`` reads it like a file: rows ``{"problem": ..., "answer": ...,
"solution": ...}``, the answer as text, the solution one worked line (``2 + 6 = 8, so the answer is \\boxed{8}.``)
that ``--worked_examples N`` shows the model as N solved chat turns before each problem. Three kinds, in turn: a
bare sum or difference (``What is 4 + 5?``), a word problem that adds and one that takes away; every operand is
1-9 and every answer a non-negative integer. (Two-step problems with operands up to 40, an earlier version, left
SmolLM2 near 5 % reward, too little for GRPO to start from.)
"""

from __future__ import annotations

import random

EASY_ARITHMETIC = "easy-arithmetic"  # the --dataset name
EASY_ARITHMETIC_ROWS = 512
_NAMES = ("Tom", "Ann", "Sam", "Mia", "Ben", "Lily", "Noah", "Emma")
_ITEMS = ("apples", "pens", "books", "cards", "eggs", "coins", "stamps", "shells")


def _bare(rng: random.Random) -> tuple[str, int, int, str]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    if rng.random() < 0.5:
        return f"What is {a} + {b}?", a, b, "+"
    a, b = max(a, b), min(a, b)
    return f"What is {a} - {b}?", a, b, "-"


def _adds(rng: random.Random) -> tuple[str, int, int, str]:
    n, it, a, b = rng.choice(_NAMES), rng.choice(_ITEMS), rng.randint(1, 9), rng.randint(1, 9)
    return f"{n} has {a} {it}. {n} gets {b} more. How many {it} does {n} have now?", a, b, "+"


def _takes_away(rng: random.Random) -> tuple[str, int, int, str]:
    n, it, a, b = rng.choice(_NAMES), rng.choice(_ITEMS), rng.randint(1, 9), rng.randint(1, 9)
    a, b = max(a, b), min(a, b)
    return f"{n} has {a} {it}. {n} gives away {b}. How many {it} does {n} have now?", a, b, "-"


def easy_arithmetic_rows(n: int = EASY_ARITHMETIC_ROWS, seed: int = 0) -> list[dict[str, str]]:
    """``n`` rows ``{"problem", "answer", "solution"}`` (kinds in turn: bare, adds, takes away); same (n, seed),
    same rows."""
    rng = random.Random(f"easy-arithmetic:{seed}")
    kinds = (_bare, _adds, _takes_away)
    rows = []
    for i in range(n):
        problem, a, b, op = kinds[i % len(kinds)](rng)
        answer = a + b if op == "+" else a - b
        rows.append({"problem": problem, "answer": str(answer),
                     "solution": f"{a} {op} {b} = {answer}, so the answer is \\boxed{{{answer}}}."})
    return rows
