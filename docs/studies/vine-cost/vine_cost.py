"""What ``vine`` costs on the lab: extra generated tokens per rollout batch and step time vs GRPO (not run in CI).

Trains the lab's warm start (``--regime long`` by default: 6-8 written steps) for a few steps with ``grpo`` and with
``vine`` (its declared defaults unless ``--k`` / ``--max-steps``) under the lab recipe (16 prompts × 8 completions,
one torch thread), and reports per rollout batch: TRL's ``step_time`` (first step dropped), the thread's CPU seconds
per step, the completion tokens TRL generated, and vine's states sampled, continuation tokens and completions graded.

    OMP_NUM_THREADS=1 python docs/studies/vine-cost/vine_cost.py [--steps 4] [--regime long] [--k 4] [--max-steps 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path


def run(credit: str, steps: int, regime: str, options: dict) -> dict:
    from oar.credit import CreditSpec
    from oar.files import read_jsonl
    from oar.lab.regimes import apply_regime
    from oar.lab.run import RunConfig, train_lab
    from oar.lab.warmstart import WarmStartConfig

    spec = CreditSpec(credit, {**options, "separator": "; "} if credit == "vine" else {})
    cfg = RunConfig(credit=str(spec), warm=apply_regime(WarmStartConfig(), regime), max_steps=steps, budget_s=1e9,
                    eval_every=10_000, eval_problems=4, eval_k=1)
    with tempfile.TemporaryDirectory() as tmp:
        summary = train_lab(cfg, tmp)
        rows = [r for r in read_jsonl(Path(tmp) / "metrics.jsonl") if "step_time" in r]
    later = rows[1:] or rows

    def mean(key: str) -> float:
        vals = [r[key] for r in later if key in r]
        return statistics.mean(vals) if vals else 0.0

    return {
        "credit": credit, "steps": summary["steps"], "step_time_s": mean("step_time"),
        "cpu_s_per_step": summary["train_seconds"] / max(summary["steps"], 1),
        "completion_tokens": 128 * mean("completions/mean_length"),  # 16 prompts × 8 completions
        "rollout_states": mean("oar/rollout_states"), "rollout_tokens": mean("oar/rollout_tokens"),
        "rollout_graded": mean("oar/rollout_graded"), "steps_per_completion": mean("oar/rollout_steps"),
        "frac_scored": mean("oar/frac_scored"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--regime", default="long")
    ap.add_argument("--k", type=int, default=None)
    ap.add_argument("--max-steps", type=int, default=None)
    a = ap.parse_args()
    options = {k: v for k, v in (("k", a.k), ("max_steps", a.max_steps)) if v is not None}
    base = run("grpo", a.steps, a.regime, {})
    vine = run("vine", a.steps, a.regime, options)
    for r in (base, vine):
        print(json.dumps(r))
    print(f"vine/grpo step time {vine['step_time_s'] / base['step_time_s']:.2f}x, CPU "
          f"{vine['cpu_s_per_step'] / base['cpu_s_per_step']:.2f}x; extra generated tokens per rollout batch "
          f"{vine['rollout_tokens']:.0f} ({vine['rollout_tokens'] / max(vine['completion_tokens'], 1):.1f}x TRL's "
          f"{vine['completion_tokens']:.0f})")


if __name__ == "__main__":
    main()
