"""Does the README's ``oar train`` demo raise SmolLM2's reward? (issue #30): the per-step reward of finished
``oar train`` run directories, averaged over windows of steps, with the share of groups whose completions all earn
the same reward (they give GRPO no signal) and the step time.

The runs (one per seed; ``--seed 0`` is the recipe's)::

    OMP_NUM_THREADS=1 oar train --config recipes/smollm2-easy-arithmetic.yaml --seed S --output_dir runs/demo-sS
    python benchmarks/bench_demo_train.py runs/demo-s0 runs/demo-s1 --out docs/results/demo_train

Writes ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from oar.files import atomic_write
from oar.rundir import RunDir


def windows(rows: list[dict], width: int) -> list[dict]:
    """Per window of ``width`` training steps: mean reward, mean share of zero-variance groups, mean s/step."""
    train = [r for r in rows if "reward" in r]
    out = []
    for lo in range(0, len(train), width):
        w = train[lo : lo + width]
        out.append({"steps": f"{w[0]['step']}-{w[-1]['step']}",
                    "reward": sum(r["reward"] for r in w) / len(w),
                    "frac_reward_zero_std": sum(r.get("frac_reward_zero_std", float("nan")) for r in w) / len(w),
                    "step_seconds": sum(r.get("step_time", float("nan")) for r in w) / len(w)})
    return out


def markdown(result: dict) -> str:
    head = [w["steps"] for w in next(iter(result["runs"].values()))]  # the first run's windows
    lines = [f"Per-step reward of `oar train --config {result['recipe']}` (mean over windows of {result['width']} "
             "steps; in brackets the share of groups whose completions all earn the same reward; s/step):", "",
             "| run | " + " | ".join(head) + " |", "|---" * (1 + len(head)) + "|"]
    for name, ws in result["runs"].items():  # a window that covers other steps than the header's says which
        lines.append(f"| {name} | " + " | ".join(
            f"{w['reward']:.2f} ({w['frac_reward_zero_std']:.2f}; {w['step_seconds']:.0f} s)"
            + ("" if i < len(head) and w["steps"] == head[i] else f" steps {w['steps']}") for i, w in enumerate(ws))
            + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="finished oar train run directories")
    ap.add_argument("--width", type=int, default=10, help="steps per window (default 10)")
    ap.add_argument("--recipe", default="recipes/smollm2-easy-arithmetic.yaml")
    ap.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    args = ap.parse_args()
    if args.width < 1:
        ap.error(f"--width must be at least 1, got {args.width}")
    for run in args.runs:
        if not (run / "metrics.jsonl").is_file():
            ap.error(f"no metrics.jsonl in {run}")
    result = {"recipe": args.recipe, "width": args.width,
              "runs": {run.name: windows(RunDir(run).metrics(), args.width) for run in args.runs}}
    text = markdown(result)
    print(text)
    if args.out:
        atomic_write(args.out.with_suffix(".json"), json.dumps(result, indent=1))
        atomic_write(args.out.with_suffix(".md"), text)


if __name__ == "__main__":
    main()
