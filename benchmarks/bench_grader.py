"""What the grader costs: its verdict and seconds on adversarial answers and golds, and the fast path's throughput on
GSM8K (not run in CI).

Each case is graded alone with the default timeout (2 s of math-verify per item, 5 s grace before a stuck helper is
killed and restarted), after a warm-up that starts the helper, so a row's seconds are what a reward call pays for
it. An exception is reported by its type (the grader of an older tree raises on some). Run it on another tree to
compare (``PYTHONPATH=OLD/src python benchmarks/bench_grader.py``): it only uses ``grade_answer`` and
``grade_answers``.

Throughput: 512 GSM8K training completions (half boxed right, half a stated answer off by one) against the raw
``####`` solutions, all settled by the fast path: the first pass, and the best of 4 more over the same batch.

    OMP_NUM_THREADS=1 python benchmarks/bench_grader.py [--json FILE] [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NINES = "9" * 400
# (label, completion, gold, the right verdict)
CASES: list[tuple[str, str, object, bool]] = [
    ("power of powers", r"\boxed{(9^9)^(9^9)}", "1", False),
    ("factorial of 10^8", r"\boxed{(99999999)!}", "1", False),
    ("binomial of 10^9", r"\boxed{\binom{10^9}{10^8}}", "1", False),
    ("tower in \\left( \\right)", r"\boxed{\left(9^{9}\right)^{\left(9^{9}\right)}}", "1", False),
    ("tower in braces", r"\boxed{9^{9^{9^{9}}}}", "1", False),
    ("9-digit exponent", r"\boxed{2^{123456789}}", "1", False),
    ("factorial of 10^5", r"\boxed{100000!}", "1", False),
    ("double factorial", r"\boxed{9000!!}", "1", False),
    ("Gamma of 10^6", r"\boxed{\Gamma(10^{6})}", "1", False),
    ("product to 10^6", r"\boxed{\prod_{i=1}^{10^{6}} i}", "1", False),
    ("huge gold (a tower)", r"\boxed{1}", r"(9^9)^(9^9)", False),
    ("400-digit fraction", rf"\boxed{{\frac{{{NINES}}}{{1}}}}", "1", False),
    ("400-digit integer gold", r"\boxed{1}", 10**400, False),
    ("5000-digit integer gold", r"\boxed{1}", 10**5000, False),
    ("near-miss integer", r"\boxed{1234568}", "1234567", False),
    ("big integers, one digit off", r"\boxed{123456789012345678901}", "123456789012345678902", False),
    ("near-miss rational", r"\boxed{0.3333333}", r"\frac13", False),
    ("digits across a newline", "4\n2", "42", False),
    ("digits across a space", "4 2", "42", False),
    ("a space read as a sum", r"\boxed{4 2}", "6", False),
    ("NUL after the answer", "\\boxed{1\x00}", "1", True),
    ("vulgar fraction", r"\boxed{½}", r"\frac12", True),
    ("superscript", "x²", "x^2", True),
    ("legit large power", r"\boxed{2^{2023}}", r"2^{2024}/2", True),
    ("legit large factorial", r"\boxed{2023!}", r"2023 \cdot 2022!", True),
    ("scientific notation", r"\boxed{4.5 \times 10^{33}}", "4.5e33", True),
]


def grade_case(completion: str, gold: object) -> tuple[str, float]:
    from oar.grading import grade_answer

    t0 = time.perf_counter()
    try:
        verdict: str = str(grade_answer(completion, gold))
    except Exception as err:  # noqa: BLE001  (an older tree's grader raises: that is the result)
        verdict = type(err).__name__
    return verdict, time.perf_counter() - t0


def throughput(data: Path) -> tuple[float, float, int]:
    """(items per CPU second on first sight, the best of 4 more passes over the same batch, completions graded right)
    of the fast path on 512 GSM8K completions. Later passes see golds already read (the grader caches them, as
    when a group of G completions shares its gold)."""
    from oar.grading import grade_answers

    rows = [json.loads(line) for line in (data / "gsm8k" / "train.jsonl").read_text().splitlines()[:512]]
    golds = [r["answer"] for r in rows]
    finals = [r["answer"].split("####")[-1].strip() for r in rows]
    completions = [f"Let me think. {r['question'][:200]}\nSo the total is \\boxed{{{f}}}." if i % 2
                   else f"... The answer is {int(f.replace(',', '')) + 1}"
                   for i, (r, f) in enumerate(zip(rows, finals, strict=True))]
    seconds, right = [], 0
    for _ in range(5):  # CPU seconds of this process: the fast path runs here, and a shared machine's load
        t0 = time.process_time()  # would swamp wall-clock time
        right = sum(grade_answers(completions, golds))
        seconds.append(time.process_time() - t0)
    return len(completions) / seconds[0], len(completions) / min(seconds[1:]), right


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="the benchmark data")
    args = parser.parse_args()

    from oar.grading import grade_answer, grade_answers

    grade_answer(r"\boxed{x+1}", "1+x")  # start and warm the helper
    rows = []
    for label, completion, gold, right in CASES:
        verdict, seconds = grade_case(completion, gold)
        rows.append({"case": label, "verdict": verdict, "right": str(right), "seconds": round(seconds, 3)})
    eight = [c for _, c, _, _ in CASES[:8]]
    t0 = time.perf_counter()
    try:
        grade_answers(eight, ["1"] * len(eight))
        batch = "ok"
    except Exception as err:  # noqa: BLE001
        batch = type(err).__name__
    rows.append({"case": "the first 8 in one call", "verdict": batch, "right": "ok",
                 "seconds": round(time.perf_counter() - t0, 3)})

    print("| case | verdict | right | seconds |\n|---|---|---|---:|")
    for r in rows:
        flag = "" if r["verdict"] == r["right"] else " **(wrong)**"
        print(f"| {r['case']} | {r['verdict']}{flag} | {r['right']} | {r['seconds']:.2f} |")
    first, again, right = throughput(Path(args.data))
    print(f"\nfast path, 512 GSM8K completions: {first:,.0f} items per CPU second first sight, {again:,.0f} again "
          f"({right} graded right of 256 right)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cases": rows, "fast_path_items_per_s": {"first": first, "again": again},
                       "fast_path_right": right}, f, indent=2)


if __name__ == "__main__":
    main()
