"""The arithmetic lab task: solutions are correct, labels exact, splits disjoint, knobs do what they say."""

from __future__ import annotations

import random
import re

import pytest

from oar.lab.task import (
    ANSWER,
    FILLER,
    PIVOTAL,
    STRUCTURE,
    TaskConfig,
    extract_int,
    lab_reward,
    make_problem,
    make_split,
    max_completion_chars,
)


def _eval_chain(prompt: str) -> int:
    nums = re.findall(r"[+-]?\d+", prompt.rstrip("="))
    return sum(int(n) for n in nums)


@pytest.mark.parametrize("verbosity", [0, 3])
def test_solutions_are_correct_and_labels_exact(verbosity):
    cfg = TaskConfig(verbosity=verbosity, min_steps=1, max_steps=4)
    for p in make_split(cfg, "train", 300, seed=1):
        assert p.answer == _eval_chain(p.prompt)
        assert extract_int(p.completion) == p.answer
        assert len(p.labels) == len(p.completion)
        lab = "".join("PSFA"[x] for x in p.labels)
        # pivotal chars are exactly the digits of the worked steps; the boxed statement is the answer span
        reasoning, boxed = p.completion[: p.completion.rindex("\\boxed{")], p.completion[p.completion.rindex("\\"):]
        assert lab.endswith("A" * len(boxed)) and ANSWER not in p.labels[: len(reasoning)]
        assert all((c.isdigit()) == (x == PIVOTAL) for c, x in zip(reasoning, p.labels, strict=False))
        filler = "".join(c for c, x in zip(p.completion, p.labels, strict=True) if x == FILLER)
        assert not any(c.isdigit() for c in filler)
        assert (len(filler) > 0) == (verbosity > 0)
        # every step "a op b = c" restates the running value and computes it correctly
        steps = re.findall(r"(\d+)([+-])(\d+)=(\d+)", reasoning)
        assert len(steps) == len(re.findall(r"[+-]", p.prompt))
        for a, op, b, c in steps:
            assert int(c) == (int(a) + int(b) if op == "+" else int(a) - int(b))
        assert STRUCTURE in p.labels
        assert len(p.completion) <= max_completion_chars(cfg)


def test_verbosity_lengthens_and_dilutes_pivotal_tokens():
    def stats(v):
        ps = make_split(TaskConfig(verbosity=v), "train", 400)
        n = sum(len(p.completion) for p in ps)
        return n / len(ps), sum(p.labels.count(PIVOTAL) for p in ps) / n

    (len0, piv0), (len2, piv2) = stats(0), stats(2)
    assert len2 > 1.8 * len0
    assert piv2 < 0.6 * piv0


def test_splits_are_disjoint_and_deterministic():
    cfg = TaskConfig()
    train = make_split(cfg, "train", 2000, seed=3)
    test = make_split(cfg, "test", 300)
    assert not {p.prompt for p in train} & {p.prompt for p in test}
    assert make_split(cfg, "test", 300) == test
    assert make_split(cfg, "train", 50, seed=4) != make_split(cfg, "train", 50, seed=3)


def test_values_stay_in_range_and_slips_corrupt_chains():
    cfg = TaskConfig(max_value=40, start_lo=30, start_hi=40, max_operand=9, slip_rate=0.5, verbosity=0)
    rng = random.Random(0)
    wrong = 0
    for _ in range(300):
        p = make_problem(rng, cfg)
        assert all(0 <= int(v) <= 40 for v in re.findall(r"\d+", p.completion))
        wrong += extract_int(p.completion) != p.answer
    assert 0.4 < wrong / 300 < 0.95  # about 1 - 0.5^steps, minus slips that cancel


def test_reward_and_extraction():
    assert lab_reward(["1+2=3; \\boxed{3}", "\\boxed{4}", "no answer", "\\boxed{3"], [3, 3, 3, 3]) == [1, 0, 0, 0]
    assert extract_int("\\boxed{x}") is None


@pytest.mark.parametrize("bad", [dict(min_steps=0), dict(min_steps=3, max_steps=2), dict(verbosity=-1),
                                 dict(slip_rate=1.0), dict(start_hi=200)])
def test_bad_config_raises(bad):
    with pytest.raises(ValueError):
        TaskConfig(**bad)
    with pytest.raises(ValueError, match="split"):
        make_split(TaskConfig(), "valid", 3)
