"""Where the time of one SmolLM2 GRPO step goes, per operator (torch.profiler), phase by phase (issue #47).

A trainer is built as ``oar train`` builds it (this machine's CPU defaults, :func:`oar.train_run.cpu_defaults`) at
one of the shapes of ``_lm_step.py`` (``bench``, ``lab``, ``demo``); the first step is a warm-up, the next one is
profiled, each phase (generation, rewards, token credit, the loss forward, the backward, the optimizer step) under
its own ``torch.profiler`` so its operator table is its own.

    OMP_NUM_THREADS=1 python benchmarks/bench_lm_profile.py --shape lab --credits grpo,oar-g,oar-p@horizon=2 \
        --out docs/results/lm_profile/lab

Writes ``OUT.md`` (phase seconds, then each phase's top operators by self CPU time) and ``OUT.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _lm_step import PHASES, SHAPES, build_trainer_at, cpu_features, step_tokens


def profile_one(shape: str, credit: str, rows: int, overrides: dict) -> dict:
    """Train two steps of ``shape`` with ``credit``; the second one profiled phase by phase."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import TrainerCallback

    from oar.quiet import quiet_libraries

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    seconds: dict[str, float] = {}  # wall seconds per phase
    cpu: dict[str, float] = {}  # the training thread's CPU seconds per phase (other jobs on the machine excluded)
    tables: dict[str, list] = {}
    tokens: dict[str, float] = {}
    state = {"step": 0, "t0": 0.0, "total": 0.0}

    def phase(name, f):
        @functools.wraps(f)
        def g(*a, **k):
            if state["step"] != 1:  # the warm-up step is not profiled
                return f(*a, **k)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                t, c = time.perf_counter(), time.thread_time()
                out = f(*a, **k)
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t
                cpu[name] = cpu.get(name, 0.0) + time.thread_time() - c
            ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
            tables.setdefault(name, []).extend(
                {"op": e.key, "calls": e.count, "self_s": e.self_cpu_time_total / 1e6} for e in ops[:rows])
            return out
        return g

    class Clock(TrainerCallback):
        def on_step_begin(self, args, st, control, **kw):
            state["t0"] = time.perf_counter()

        def on_step_end(self, args, st, control, **kw):
            if state["step"] == 1:
                state["total"] = time.perf_counter() - state["t0"]
            state["step"] += 1

    with quiet_libraries(False):
        trainer = build_trainer_at(shape, credit, 2, overrides)
    trainer.add_callback(Clock())
    trainer._generate_single_turn = phase("generate", trainer._generate_single_turn)
    trainer._calculate_rewards = phase("reward", trainer._calculate_rewards)
    trainer._token_credit = phase("credit", trainer._token_credit)
    trainer.compute_loss = phase("forward", trainer.compute_loss)
    trainer.accelerator.backward = phase("backward", trainer.accelerator.backward)
    trainer.create_optimizer()
    trainer.optimizer.step = phase("optimizer", trainer.optimizer.step)
    score = trainer._generate_and_score_completions

    def count(inputs):
        out = score(inputs)
        if state["step"] == 1:
            tokens.update(step_tokens(out))
        return out

    trainer._generate_and_score_completions = count
    with quiet_libraries(False):
        trainer.train()
    return {"shape": shape, "credit": credit, "step_s": state["total"], "seconds": seconds, "cpu_seconds": cpu,
            "tables": tables,
            "tokens": tokens, "overrides": overrides}


def markdown(results: list[dict], machine: dict) -> str:
    lines = [f"# One SmolLM2 GRPO step, per phase and operator (benchmarks/bench_lm_profile.py, shape "
             f"`{results[0]['shape']}`)", "",
             f"CPU: {machine['cpu']['model']} ({', '.join(machine['cpu']['flags']) or 'no AVX flags'}); torch "
             f"{machine['torch']}, {machine['threads']} thread(s); defaults {machine['defaults']}.", "",
             "Seconds per phase: wall (the training thread's CPU seconds in brackets). The step's wall time includes"
             " the profiler's own bookkeeping between phases.", "",
             "| credit | step s | " + " | ".join(PHASES) + " | rows | prompt tok | completion tok |",
             "|---|---|" + "---|" * len(PHASES) + "---|---|---|"]
    for r in results:
        t = r["tokens"]
        lines.append(f"| `{r['credit']}` | {r['step_s']:.2f} | "
                     + " | ".join(f"{r['seconds'].get(p, 0.0):.2f} ({r['cpu_seconds'].get(p, 0.0):.2f})"
                                  for p in PHASES)
                     + f" | {t.get('rows', 0):.0f} | {t.get('prompt', 0):.0f} | {t.get('completion', 0):.0f} |")
    for r in results:
        for p in PHASES:
            ops = r["tables"].get(p)
            if not ops:
                continue
            lines += ["", f"## `{r['credit']}`: {p} ({r['seconds'][p]:.2f} s)", "", "| operator | calls | self s |",
                      "|---|---|---|"]
            lines += [f"| `{o['op']}` | {o['calls']} | {o['self_s']:.3f} |" for o in ops]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=SHAPES, default="bench")
    ap.add_argument("--credits", default="grpo")
    ap.add_argument("--rows", type=int, default=12, help="operators listed per phase")
    ap.add_argument("--set", default="{}", help="OARConfig overrides as a JSON object")
    ap.add_argument("--out", default="runs/lm_profile")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    overrides = json.loads(a.set)
    if a.one:
        print(json.dumps(profile_one(a.shape, a.one, a.rows, overrides)))
        return
    import torch

    from oar.files import atomic_write
    from oar.train_run import cpu_defaults

    machine = {"cpu": cpu_features(), "torch": torch.__version__, "threads": os.environ.get("OMP_NUM_THREADS", "1"),
               "defaults": cpu_defaults()}
    results = []
    for credit in a.credits.split(","):
        cmd = [sys.executable, __file__, "--shape", a.shape, "--one", credit, "--rows", str(a.rows), "--set", a.set]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"credit {credit} failed:\n{out.stderr[-3000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(r)
        print(f"{credit:20s} step {r['step_s']:6.2f} s  " + "  ".join(
            f"{p} {r['seconds'].get(p, 0.0):.2f}" for p in PHASES), flush=True)
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path.with_suffix(".json"), json.dumps({"machine": machine, "results": results}, indent=1))
    atomic_write(path.with_suffix(".md"), markdown(results, machine))


if __name__ == "__main__":
    main()
