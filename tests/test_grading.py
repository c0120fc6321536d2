"""The grader: extraction, gold normalisation, math-verify equivalence, time bounds, TRL rewards."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import oar.grading.verify as grading  # the helper pool's internals
from helpers import TEST_DATA as SHARED_DATA  # the vendored first rows of each benchmark
from helpers import shared_data
from oar.grading import (
    extract_answer,
    format_reward,
    gold_answer,
    grade_answer,
    grade_answers,
    make_math_reward,
    math_reward,
    normalize_gold,
)

BENCHMARK_FILES = ["gsm8k/test.jsonl", "math500/test.jsonl", "aime24/test.jsonl", "amc23/test.jsonl",
                   "minerva_math/test.jsonl", "olympiadbench/test.jsonl"]


def _rows(rel: str, data: str = SHARED_DATA) -> list[dict]:
    path = Path(data, rel)
    if not path.is_file():
        pytest.fail(f"shared benchmark file missing: {path}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _raw_gold(row: dict):
    """The gold exactly as the file stores it (GSM8K solution, AMC float, OlympiadBench list, ...)."""
    return row.get("final_answer", row.get("answer"))


def _latex_variant(gold: str) -> str | None:
    """An equivalent spelling that is not string-equal, so math-verify (not the fast path) must decide."""
    variant = gold.replace("\\frac", "\\dfrac").replace("\\left", "").replace("\\right", "")
    return variant if variant != gold else None


@pytest.mark.parametrize("rel", BENCHMARK_FILES)
def test_every_gold_answer_matches_its_canonical_forms(rel):
    rows = _rows(rel, shared_data())  # every row of the full file
    golds = [gold_answer(r) for r in rows]
    raws = [_raw_gold(r) for r in rows] if "minerva" not in rel else golds  # Minerva: only a solution
    forms = [
        lambda g: f"Let me compute.\nSo we get $\\boxed{{{g}}}$.",
        lambda g: g,
        lambda g: f"Step 1 ...\nThe answer is {g}",
        lambda g: f"Step 1 ...\nThe answer is ${g}$.",
    ]
    for form in forms:
        completions = [form(g) for g in golds]
        verdicts = grade_answers(completions, raws)  # raw golds: the normalisation is part of the test
        bad = [(c, r) for c, r, ok in zip(completions, raws, verdicts, strict=True) if not ok]
        assert not bad, f"{len(bad)} of {len(rows)} gold answers of {rel} fail, e.g. {bad[:3]}"
    variants = [(_latex_variant(g), g) for g in golds if _latex_variant(g)]
    # a generous timeout: this checks equivalence, not speed (a loaded machine parses slowly)
    verdicts = grade_answers([f"\\boxed{{{v}}}" for v, _ in variants], [g for _, g in variants], timeout=20)
    bad = [p for p, ok in zip(variants, verdicts, strict=True) if not ok]
    assert not bad, f"math-verify rejects LaTeX variants of {rel} golds: {bad[:3]}"


def test_benchmark_gold_quirks():
    aime = {r["answer"]: r for r in _rows("aime24/test.jsonl")}
    assert gold_answer(aime["025"]) == "25" and grade_answer("\\boxed{25}", aime["025"]["answer"])
    amc = _rows("amc23/test.jsonl")[0]
    assert amc["answer"] == 27.0 and gold_answer(amc) == "27"
    gsm = _rows("gsm8k/test.jsonl")[0]
    assert gold_answer(gsm) == "18" and grade_answer("#### 18", gsm["answer"])
    minerva = _rows("minerva_math/test.jsonl")[0]
    assert "answer" not in minerva and gold_answer(minerva) == extract_answer(minerva["solution"])
    olympiad = next(r for r in _rows("olympiadbench/test.jsonl") if r["is_multiple_answer"])
    assert "$" not in gold_answer(olympiad)


@pytest.mark.parametrize(
    "raw, expected",
    [
        (27.0, "27"), (2.5, "2.5"), ("025", "25"), ("1,000", "1000"), ("Work...\n#### 1,234", "1234"),
        (["$\\frac{1}{2}$"], "\\frac{1}{2}"), (["$0,-1$,$-\\frac{3}{2}$"], "0,-1, -\\frac{3}{2}"),
        ("4.5e33", "4.5e33"), ("8.0e2", "800"), ("$x+1$", "x+1"),
    ],
)
def test_normalize_gold(raw, expected):
    assert normalize_gold(raw) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{\\frac{1}{2}} and finally \\boxed{\\frac{\\sqrt{3}}{2}}.", "\\frac{\\sqrt{3}}{2}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("the answer is 7 apples.\nDone", "7 apples"),
        ("work\n#### 1,000", "1,000"),
        ("The answer is: $\\frac{3}{4}$.", "\\frac{3}{4}"),
        ("42", "42"),
        ("a line\nand another without an answer", None),
        ("One line of reasoning that never ends", None),
        ("\\text{Monday and Tuesday}", "\\text{Monday and Tuesday}"),
        ("I think it is \\boxed{12", None),  # cut off inside the box
        ("", None),
        # no final-answer statement: the whole text is the answer only when it is one plain expression
        (" 6 \n", "6"), ("$-3$", "-3"), ("\\(x=2\\)", "x=2"), ("\\[\\frac{3}{4}\\]", "\\frac{3}{4}"),
        ("$$2\\sqrt{2}$$", "2\\sqrt{2}"), ("6 \\text{apples}", "6 \\text{apples}"), ("\\sin x + 2", "\\sin x + 2"),
        ("1+5 is 6, \\boxe+2, \\boxe", None), ("The sum is 1+5", None), ("6 apples", None), ("so 6", None),
        ("\\boxe+2", None), ("\\boxed{6", None), ("Adding them.\n6", None), ("6\n7", None), ("6?", None),
        ("xy", None), ("$6$ or $7$", None), ("1" * 1001, None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


# A completion with no final-answer statement ("\\boxed{...}", "the answer is ...", "#### ...") earns the reward
# only when its whole text is one plain answer: digits, operators, brackets, single letters, LaTeX math commands,
# \\text{} groups; one word outside \\text{} or a second line makes it prose with no answer.
BARE_SHAPES = [
    ("6", "6", True), (" 6 \n", "6", True), ("\t6\t", 6, True), ("$6$", "6", True), ("6.", "6", True),
    ("7", "6", False), ("-3", "-3", True), ("$-3$", -3.0, True), ("-3", "3", False), ("1,000", "1000", True),
    ("\\frac{1}{2}", "0.5", True), ("\\frac{1}{2}", "1/2", True), ("1/2", "\\frac12", True),
    ("\\frac{1}{3}", "0.33", False), ("$x=2$", "2", True), ("\\(x=2\\)", "2", True),
    ("\\[\\frac{3}{4}\\]", "0.75", True), ("2\\sqrt{2}", "\\sqrt{8}", True), ("x^2+2x+1", "(x+1)^2", True),
    ("(-\\infty, 3]", "(-\\infty,3]", True), ("\\{1, 2\\}", "\\{2,1\\}", True),
    ("\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\-2\\end{pmatrix}", True),
    ("50\\%", "0.5", True), ("\\$18", "18", True), ("10^\\circ", "10", True),
    ("(C)", "C", True), ("\\text{(C)}", "C", True), ("6 \\text{apples}", "6", True),
    ("1+5", "6", True),  # an arithmetic expression, as math-verify reads \boxed{1+5}
    ("$69$, $84$", "69, 84", True), ("$69$, $84$", "69", False), ("k \\geqslant 2", "k\\geq2", True),
    ("1+5 is 6, \\boxe+2, \\boxe", "6", False), ("The sum is 1+5", "6", False), ("6 apples", "6", False),
    ("I added them and got 6", "6", False), ("Adding them.\n6", "6", False), ("6\n6", "6", False),
    ("so 6", "6", False), ("\\boxe+2", "2", False), ("6?", "6", False), ("答案 6", "6", False),
    ("\\boxed{6", "6", False),  # cut off inside the box: no answer
    ("\\boxed{6}", "6", True), ("the answer is 6", "6", True), ("Adding them.\nThe answer is 6", "6", True),
    ("We get 1+5 is 6, so\n#### 6", "6", True), ("Adding them.\n\\boxed{-\\frac{1}{2}}", "-0.5", True),
]


def test_bare_answers_are_whole_text_plain_answers():
    completions, golds, expected = zip(*BARE_SHAPES, strict=True)
    got = grade_answers(list(completions), list(golds))
    assert [(c, g) for c, g, e, ok in zip(completions, golds, expected, got, strict=True) if e != ok] == []
    assert math_reward(None, ["1+5 is 6, \\boxe+2, \\boxe", "6", "\\boxed{6}"], answer=["6"] * 3) == [0.0, 1.0, 1.0]


EQUIVALENT = [
    ("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{0.5}", "\\frac12"),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}"), ("\\boxed{50\\%}", "50"), ("\\boxed{50\\%}", "0.5"),
    ("The answer is 1,000.", "1000"), ("#### 1,234,567", "1234567"), ("\\boxed{025}", "25"),
    ("\\boxed{27}", 27.0), ("\\boxed{27.0}", "27"), ("The answer is $18.", "18"),
    ("The answer is \\$18.00", "18"), ("\\boxed{18 \\text{ dollars}}", "18"),
    ("The answer is 18 dollars.", "18"), ("\\boxed{\\{1, 2, 3\\}}", "\\{3,2,1\\}"),
    ("\\boxed{3, 1, 2}", "1,2,3"), ("\\boxed{[1, 2)}", "[1,2)"), ("\\boxed{(-\\infty, 3]}", "(-\\infty,3]"),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "(3,\\frac{\\pi}{2})"),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}}", "\\begin{pmatrix}1\\\\-2\\end{pmatrix}"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"), ("\\boxed{(x+1)^2}", "x^2+2x+1"), ("\\boxed{x = 5}", "5"),
    ("\\boxed{10^\\circ}", "10"), ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{1}{2}\\sqrt3"),
    ("\\boxed{1.5 \\times 10^{3}}", "1500"), ("\\boxed{\\text{(C)}}", "C"),
    ("\\boxed{-\\frac{3}{2}}", "-1.5"),
]
NOT_EQUIVALENT = [
    ("\\boxed{\\frac{1}{3}}", "0.33"), ("\\boxed{(1, 2]}", "[1,2)"), ("\\boxed{(2, 1)}", "(1,2)"),
    ("\\boxed{3.14}", "\\pi"), ("\\boxed{24}", "25"), ("\\boxed{2\\pi}", "2"), ("The answer is 5x.", "5"),
    ("\\boxed{x^2-1}", "(x-1)^2"), ("\\boxed{\\{1, 2\\}}", "\\{1,2,3\\}"), ("\\boxed{-5}", "5"),
    ("\\boxed{}", "0"), ("\\boxed{5", "5"),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix}2\\\\1\\end{pmatrix}"),
    ("\\boxed{1000}", "100"), ("\\boxed{50\\%}", "5"), ("\\boxed{\\sqrt{2}}", "1.41"),
    ("no answer here\nat all", "5"),
]


def test_tricky_pairs():
    eq = grade_answers([c for c, _ in EQUIVALENT], [g for _, g in EQUIVALENT])
    assert [p for p, ok in zip(EQUIVALENT, eq, strict=True) if not ok] == []
    neq = grade_answers([c for c, _ in NOT_EQUIVALENT], [g for _, g in NOT_EQUIVALENT])
    assert [p for p, ok in zip(NOT_EQUIVALENT, neq, strict=True) if ok] == []


def test_grading_from_threads_matches_main_thread():
    pairs = EQUIVALENT[:8] + NOT_EQUIVALENT[:8]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda p: grade_answer(*p), pairs))
    assert got == [True] * 8 + [False] * 8


def _grade_in_child(queue):
    queue.put([grade_answer("\\boxed{\\frac{2}{4}}", "0.5"), grade_answer("\\boxed{\\frac{1}{3}}", "0.5")])


def test_grading_in_a_daemonic_subprocess():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_grade_in_child, args=(queue,), daemon=True)  # may not have mp children
    proc.start()
    assert queue.get(timeout=120) == [True, False]
    proc.join(30)


def test_adversarial_answers_are_time_bounded():
    nasty = ["\\boxed{" + "(" * 30 + "1" + ")" * 30 + "}", "\\boxed{9^{9^{9^{9}}}}", "\\boxed{100000!}",
             "\\boxed{2^{123456789}}", "\\boxed{" + "\\frac{1}{2}" * 150 + "}", "\\boxed{" + "x" * 5000 + "}"]
    grade_answer("\\boxed{\\frac12}", "0.5")  # helper started
    t0 = time.perf_counter()
    verdicts = grade_answers(nasty, ["1"] * len(nasty), timeout=0.5)
    assert verdicts == [False] * len(nasty)
    assert time.perf_counter() - t0 < len(nasty) * (0.5 + 1.0)


def test_stuck_helper_is_killed_and_replaced(monkeypatch):
    monkeypatch.setattr(grading, "_GRACE", 0.5)
    monkeypatch.setattr(grading, "_pool", grading._Pool(1))  # one helper, so the next call must use it
    assert grade_answer("\\boxed{\\sqrt{2}}", "\\frac{2}{\\sqrt{2}}")
    pool = grading._get_pool()
    helper = pool.slots.get()
    pool.slots.put(helper)
    os.kill(helper.proc.pid, signal.SIGSTOP)  # a helper that never answers
    t0 = time.perf_counter()
    assert grade_answer("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", timeout=0.5) is False  # deadline: not equivalent
    assert time.perf_counter() - t0 < 5
    assert helper.proc.poll() is not None  # killed
    assert grade_answer("\\boxed{2\\sqrt{2}}", "\\sqrt{8}")  # a fresh helper
    pool.close()


def test_math_reward_is_trl_compatible():
    gsm = _rows("gsm8k/train.jsonl")[:2]
    golds = [r["answer"] for r in gsm]  # raw GSM8K solutions, as a TRL dataset column
    plain = ["... #### 72", "The answer is \\boxed{9}."]
    conversational = [[{"role": "assistant", "content": c}] for c in plain]
    trl_kwargs = dict(completion_ids=[[1], [2]], trainer_state=None, log_extra=None, log_metric=None)
    assert golds[0].endswith("#### 72") and not golds[1].endswith("#### 9")
    assert math_reward(["p"] * 2, plain, answer=golds, **trl_kwargs) == [1.0, 0.0]
    assert math_reward(["p"] * 2, conversational, answer=golds, **trl_kwargs) == [1.0, 0.0]
    custom = make_math_reward("final_answer")
    assert custom.__name__ == "math_reward_final_answer"
    assert custom(["p"], ["\\boxed{x+1}"], final_answer=[["$1+x$"]]) == [1.0]
    with pytest.raises(ValueError, match="final_answer"):
        math_reward(["p"], ["\\boxed{1}"], answer_key="final_answer", answer=["1"])


def test_format_reward_is_separate():
    completions = ["so \\boxed{3}", "the answer is 3", "\\boxed{3"]
    assert format_reward(None, completions) == [1.0, 0.0, 0.0]
    assert math_reward(None, completions, answer=["3"] * 3) == [1.0, 1.0, 0.0]


def test_mismatched_lengths_and_bad_rows_raise():
    with pytest.raises(ValueError, match="2 completions but 1 gold"):
        grade_answers(["a", "b"], ["1"])
    with pytest.raises(ValueError, match="benchmark 'x' has no gold answer"):
        gold_answer({"question": "q"}, "x")


def test_math_reward_drives_trl_grpo(tmp_path, char_tokenizer):
    """math_reward and format_reward plug into TRL's GRPOTrainer on raw GSM8K-like gold solutions: fixed completions
    earn known rewards, and in a real step TRL hands the rewards the sampled completions with the dataset's answer
    column and logs their grades (whatever the model samples)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from trainer_setup import grpo_kwargs, task_rows, warm_tiny_lm

    rows = [{"prompt": r["prompt"], "answer": f"Work.\n#### {r['answer']}"} for r in task_rows(16)]
    fixed = ["3+4 is 7, \\boxed{7}", "3+4 is 7, \\boxed{8}", "3+4 is 7, \\boxed{7", "3+4 is 7, \\boxe+2, \\boxe", "7",
             "3+4 is 7"]
    assert math_reward(None, fixed, answer=["Work.\n#### 7"] * 6) == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert format_reward(None, fixed) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]

    seen = []

    def spy(prompts, completions, answer, **kwargs):  # what TRL hands to a reward function
        seen.extend(zip(prompts, completions, answer, strict=True))
        return [0.0] * len(completions)

    trainer = GRPOTrainer(
        model=warm_tiny_lm(char_tokenizer),
        processing_class=char_tokenizer,
        reward_funcs=[math_reward, format_reward, spy],
        args=GRPOConfig(**grpo_kwargs(str(tmp_path), max_steps=1)),
        train_dataset=Dataset.from_list(rows),
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    assert len(seen) == 8
    gold_of = {r["prompt"]: r["answer"] for r in rows}
    assert all(isinstance(c, str) and a == gold_of[p] for p, c, a in seen)  # the answer column, row by row
    completions, golds = [c for _, c, _ in seen], [a for _, _, a in seen]
    expected_math = sum(grade_answers(completions, golds)) / len(seen)
    expected_format = sum(format_reward(None, completions)) / len(seen)
    assert math.isclose(logged["rewards/math_reward/mean"], expected_math, abs_tol=1e-6)
    assert math.isclose(logged["rewards/format_reward/mean"], expected_format, abs_tol=1e-6)
    assert logged["grading/errors"] == 0.0 and logged["grading/timeouts"] == 0.0  # math_reward's log_metric counts
