"""Where the time of one SmolLM2 GRPO step goes, per operator (torch.profiler), phase by phase (issue #47).

A trainer is built as ``oar train`` builds it (the CPU defaults of this machine, :func:`oar.train_run.cpu_defaults`)
at one of three shapes; the first step is a warm-up, the next one is profiled, each phase (generation, rewards,
token credit, the loss forward, the backward, the optimizer step) under its own ``torch.profiler`` so its operator
table is its own:

- ``bench``: ``bench_lm_step.py``'s shape, 2 prompts × 8 completions of <= 96 tokens, bundled ``easy-arithmetic``;
- ``lab``: the LM lab's, 4 prompts × 4 completions of the lab task in SmolLM2's chat template (lr 5e-6,
  ``dr_grpo``), on the base model (the profile needs the shapes, not the warm start's weights);
- ``demo``: ``recipes/smollm2-easy-arithmetic.yaml`` (4 × 8, <= 32 tokens, two worked examples as chat turns).

    OMP_NUM_THREADS=1 python benchmarks/profile_lm_step.py --shape lab --credits grpo,oar-g,oar-p@horizon=2 \
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

PHASES = ("generate", "reward", "credit", "forward", "backward", "optimizer")
SHAPES = ("bench", "lab", "demo")


def cpu_features() -> dict:
    """The CPU's model name and the matmul-relevant feature flags Linux reports (avx2, avx512*, amx*)."""
    out = {"model": "unknown", "flags": []}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("model name") and out["model"] == "unknown":
            out["model"] = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            flags = line.split(":", 1)[1].split()
            out["flags"] = sorted(f for f in flags if f.startswith(("avx2", "avx512", "amx", "fma")))
            break
    return out


def build(shape: str, credit: str, steps: int, overrides: dict):
    """The trainer of ``shape`` with ``credit``, ``steps`` steps, this machine's CPU defaults plus ``overrides``."""
    from oar.train_run import TrainArguments, build_trainer, cpu_defaults
    from oar.trainer import OARConfig

    common = dict(output_dir=f"/tmp/oar-profile/{shape}", credit=credit, seed=0, max_steps=steps, beta=0.0,
                  logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, **cpu_defaults())
    common.update(overrides)
    if shape in ("bench", "demo"):
        worked = 2 if shape == "demo" else 0
        size = (4, 8, 32, 1e-5) if shape == "demo" else (2, 8, 96, 1e-5)
        config = OARConfig(per_device_train_batch_size=size[0] * size[1], num_generations=size[1],
                           max_completion_length=size[2], learning_rate=size[3], temperature=1.0, **common)
        script = TrainArguments(model="smollm2", dataset="easy-arithmetic", conversational="true" if worked else "auto",
                                prompt_template="{question}" if worked else TrainArguments.prompt_template,
                                worked_examples=worked)
        return build_trainer(script, config)
    from datasets import Dataset

    from oar.lab.lm import LM_RECIPE
    from oar.lab.task import BOXED, TaskConfig, lab_reward, make_split, max_completion_chars
    from oar.models import load_model_and_tokenizer
    from oar.trainer import OARGRPOTrainer

    task = TaskConfig()
    train = make_split(task, "train", 256, seed=0)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": p.prompt}], "answer": p.answer} for p in train])
    model, tok = load_model_and_tokenizer("smollm2")
    config = OARConfig(per_device_train_batch_size=LM_RECIPE["prompts_per_step"] * LM_RECIPE["group_size"],
                       num_generations=LM_RECIPE["group_size"], max_completion_length=max_completion_chars(task) + 8,
                       learning_rate=LM_RECIPE["lr"], loss_type="dr_grpo", temperature=1.0, top_k=0, top_p=1.0,
                       lr_scheduler_type="constant", conclude_text=BOXED, **common)
    return OARGRPOTrainer(model=model, args=config, processing_class=tok, reward_funcs=lab_reward, train_dataset=ds)


def profile_one(shape: str, credit: str, rows: int, overrides: dict) -> dict:
    """Train two steps of ``shape`` with ``credit``; the second one profiled phase by phase."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import TrainerCallback

    from oar.quiet import quiet_libraries

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    seconds: dict[str, float] = {}
    tables: dict[str, list] = {}
    tokens: dict[str, float] = {}
    state = {"step": 0, "t0": 0.0, "total": 0.0}

    def phase(name, f):
        @functools.wraps(f)
        def g(*a, **k):
            if state["step"] != 1:  # the warm-up step is not profiled
                return f(*a, **k)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                t = time.perf_counter()
                out = f(*a, **k)
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t
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
        trainer = build(shape, credit, 2, overrides)
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
            tokens.update(completion=float(out["completion_mask"].sum()), prompt=float(out["prompt_mask"].sum()),
                          rows=float(out["completion_ids"].shape[0]), decode_steps=float(out["completion_ids"].shape[1]))
        return out

    trainer._generate_and_score_completions = count
    with quiet_libraries(False):
        trainer.train()
    return {"shape": shape, "credit": credit, "step_s": state["total"], "seconds": seconds, "tables": tables,
            "tokens": tokens, "overrides": overrides}


def markdown(results: list[dict], machine: dict) -> str:
    lines = [f"# One SmolLM2 GRPO step, per phase and operator (benchmarks/profile_lm_step.py, shape "
             f"`{results[0]['shape']}`)", "",
             f"CPU: {machine['cpu']['model']} ({', '.join(machine['cpu']['flags']) or 'no AVX flags'}); torch "
             f"{machine['torch']}, {machine['threads']} thread(s); defaults {machine['defaults']}.", "",
             "| credit | step s | " + " | ".join(PHASES) + " | rows | prompt tok | completion tok |",
             "|---|---|" + "---|" * len(PHASES) + "---|---|---|"]
    for r in results:
        t = r["tokens"]
        lines.append(f"| `{r['credit']}` | {r['step_s']:.2f} | "
                     + " | ".join(f"{r['seconds'].get(p, 0.0):.2f}" for p in PHASES)
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
