"""A SmolLM2 GRPO step on this CPU, setting by setting, against its bound (issues #30, #47).

Each setting trains ``--steps`` steps of ``oar train``'s trainer at one shape of ``_lm_step.py`` (``bench``: 2 prompts
x 8 completions of <= 96 tokens; ``lab``: the LM lab's 4 x 4; ``demo``: the CPU demo recipe's 4 x 8 with two worked
examples), in its own process, one torch thread, and times every part of every step (generation, rewards, token
credit, the loss forward, the backward, the optimizer step; the first step is a warm-up and is left out), in wall
seconds and in the training thread's CPU seconds (which other jobs on the machine do not inflate), and the process's
peak resident memory. With several ``--credits`` they run one after another in the setting's one process.

The bound of a step is what this core needs at its measured peaks, counted as TRL trains (every prompt token encoded
once per completion, in generation and in the loss): FLOPs ``2·N`` per prompt and generated token (the rollout) plus
``6·N`` per prompt and completion token (the loss forward and backward), at the matmul peak of the dtype the
setting trains in (bf16 under autocast, else fp32), plus the decode's weight reads (every decode step reads the
rollout model's weights once) at the copy bandwidth. The shared prompt (``oar_share_prompt``, the shared prefill)
encodes a group's prompt once, so a step can run below this bound.

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/bench_lm_step.py --shape bench --out docs/results/lm_step

Writes ``OUT.json`` and ``OUT.md``; prints the CPU's features and peaks first.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from _lm_step import PHASES, SHAPES, build_trainer_at, cpu_features, step_tokens

# the oar fast paths of issue #47, each one setting's switch
FAST_OFF = {"oar_fast_sampler": False, "oar_share_prompt": False, "oar_loss_batch_size": None}
# name -> (what it is, OARConfig fields over this machine's oar train CPU defaults, oar.train_run.cpu_defaults)
SETTINGS: dict[str, tuple[str, dict]] = {
    "trl": ("TRL's defaults: fp32, gradient checkpointing, transformers' generate on the policy, TRL's loss pass",
            {"gradient_checkpointing": True, "bf16": False, "oar_rollout_dtype": None, **FAST_OFF}),
    "before": ("oar train's CPU defaults before issue #47: no checkpointing; bf16 autocast + a bf16 rollout copy "
               "where bf16 is fast, else fp32 and transformers' generate; TRL's loss pass on the whole batch",
               FAST_OFF),
    "oar": ("oar train's CPU defaults: `before` + oar's sampler with the shared prefill, the shared-prompt loss "
            "pass with the head on completions only, loss micro-batches of 8 completions", {}),
    "oar-no-share": ("`oar` without the shared-prompt loss pass (TRL's pass, in micro-batches)",
                     {"oar_share_prompt": False}),
    "oar-whole-loss": ("`oar` with the loss on the whole batch at once (no micro-batches)",
                       {"oar_loss_batch_size": None}),
    "oar-trl-generate": ("`oar` with transformers' generate (no oar sampler, no shared prefill)",
                         {"oar_fast_sampler": False, "oar_rollout_dtype": None}),
}


def machine_peaks() -> dict:
    """This core's matmul throughput (GFLOP/s) at the model's shapes, fp32 and bf16, and copy bandwidth (GB/s)."""
    import torch

    def best(f, n=5):
        f()
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return min(ts)

    out = {}
    for dt in (torch.float32, torch.bfloat16):
        a, b = torch.randn(2048, 576, dtype=dt), torch.randn(576, 1536, dtype=dt)
        out[f"matmul_gflops_{str(dt)[6:]}"] = 2 * 2048 * 576 * 1536 / best(lambda a=a, b=b: a @ b) / 1e9
    src = torch.randn(64 * 2**20 // 4)
    dst = torch.empty_like(src)
    out["copy_gbps"] = 2 * src.numel() * 4 / best(lambda: dst.copy_(src)) / 1e9  # read + write
    return out


def run_setting(name: str, shape: str, credits: list[str], steps: int) -> list[dict]:
    """Train ``steps`` steps of ``shape`` under setting ``name`` for each credit; per-step seconds of each part."""
    import torch
    from transformers import TrainerCallback

    from oar.quiet import quiet_libraries

    torch.set_num_threads(1)
    out = []
    for credit in credits:
        wall: dict[str, float] = {}
        cpu: dict[str, float] = {}
        tokens: dict[str, float] = {}
        rows: list[dict] = []

        def timed(part, f, wall=wall, cpu=cpu):
            @functools.wraps(f)
            def g(*a, **kw):
                t, c = time.perf_counter(), time.thread_time()
                try:
                    return f(*a, **kw)
                finally:
                    wall[part] = wall.get(part, 0.0) + time.perf_counter() - t
                    cpu[part] = cpu.get(part, 0.0) + time.thread_time() - c
            return g

        class Clock(TrainerCallback):
            def on_step_begin(self, args, state, control, wall=wall, cpu=cpu, **kw):
                wall.clear()
                cpu.clear()
                self.t0, self.c0 = time.perf_counter(), time.thread_time()

            def on_step_end(self, args, state, control, wall=wall, cpu=cpu, tokens=tokens, rows=rows, **kw):
                rows.append({"step": state.global_step, "total": time.perf_counter() - self.t0,
                             "total_cpu": time.thread_time() - self.c0, **wall,
                             **{f"{k}_cpu": v for k, v in cpu.items()}, **tokens})

        with quiet_libraries(False):
            trainer = build_trainer_at(shape, credit, steps, SETTINGS[name][1], callbacks=[Clock()])
        trainer._generate_single_turn = timed("generate", trainer._generate_single_turn)
        trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
        trainer._token_credit = timed("credit", trainer._token_credit)
        trainer.compute_loss = timed("forward", trainer.compute_loss)  # with micro-batches: their backwards too
        trainer.accelerator.backward = timed("backward", trainer.accelerator.backward)
        trainer.create_optimizer()
        trainer.optimizer.step = timed("optimizer", trainer.optimizer.step)
        score = trainer._generate_and_score_completions

        def count(inputs, score=score, tokens=tokens):
            batch = score(inputs)
            tokens.update(step_tokens(batch))
            return batch

        trainer._generate_and_score_completions = count
        with quiet_libraries(False):
            trainer.train()
        args = trainer.args
        kept = rows[1:] if len(rows) > 1 else rows
        keys = ("total", "total_cpu", *PHASES, *(f"{p}_cpu" for p in PHASES), "rows", "prompt", "completion",
                "decode_steps")
        mean = {k: sum(r.get(k, 0.0) for r in kept) / len(kept) for k in keys}
        # compute_loss's micro-batches run their own backwards inside it: the backward column is every backward
        mean["forward"] -= mean["backward"] if args.oar_loss_batch_size else 0.0
        mean["forward_cpu"] -= mean["backward_cpu"] if args.oar_loss_batch_size else 0.0
        mean["other"] = mean["total"] - sum(mean[p] for p in PHASES)
        mean["gen_tokens_per_s"] = mean["completion"] / mean["generate"] if mean["generate"] else None
        policy = trainer.accelerator.unwrap_model(trainer.model)
        lost, total = lost_updates((p for p in policy.parameters() if p.requires_grad), args.learning_rate)
        out.append({"frac_updates_lost": lost / total, "lr": args.learning_rate, "setting": name,
                    "what": SETTINGS[name][0], "credit": credit, "shape": shape, "steps": rows,
                    "mean": mean, "params": sum(p.numel() for p in policy.parameters()),
                    "train_dtype": "bfloat16" if args.bf16 else "float32",
                    "rollout_dtype": args.oar_rollout_dtype or "float32",
                    "config": {k: getattr(args, k) for k in ("bf16", "gradient_checkpointing", "oar_rollout_dtype",
                                                             "oar_fast_sampler", "oar_share_prompt",
                                                             "oar_loss_batch_size")}})
        del trainer
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for r in out:
        r["peak_rss_gb"] = peak_kb / 2**20  # the process's peak over its credits (each setting one process)
    return out


def lost_updates(params, lr: float) -> tuple[int, int]:
    """(parameters an AdamW step of size ``lr`` leaves unchanged, parameters): Adam's first steps move each weight
    by about ``lr``, and a weight held in its own dtype keeps ``w + lr`` only when ``lr`` is at least half an ulp
    of ``w`` (bf16 keeps 8 significant bits, fp32 24). Counted in the weights' stored dtype, both directions."""
    import torch

    lost = total = 0
    for p in params:
        w = p.detach()
        step = torch.full_like(w, lr)
        lost += int(((w + step == w) & (w - step == w)).sum())
        total += w.numel()
    return lost, total


def bounds(result: dict, peaks: dict) -> dict:
    """The step's bound (module docstring): FLOPs at the training dtype's matmul peak plus the decode's weight
    reads at the copy bandwidth, and each part."""
    m, n = result["mean"], result["params"]
    rollout_flops = 2 * n * (m["prompt"] + m["completion"])
    loss_flops = 6 * n * (m["prompt"] + m["completion"])
    peak = peaks[f"matmul_gflops_{result['train_dtype']}"] * 1e9
    weight_bytes = n * (2 if result["rollout_dtype"] == "bfloat16" else 4)
    decode_s = m["decode_steps"] * weight_bytes / (peaks["copy_gbps"] / 2 * 1e9)  # copy_gbps counts read + write
    return {"flops": rollout_flops + loss_flops, "rollout_flop_s": rollout_flops / peak,
            "loss_flop_s": loss_flops / peak, "decode_read_s": decode_s,
            "bound_s": (rollout_flops + loss_flops) / peak + decode_s}


def markdown(results: list[dict], peaks: dict, machine: dict) -> str:
    r0 = results[0]
    lines = [
        f"# SmolLM2-135M GRPO step on one CPU core (benchmarks/bench_lm_step.py, shape `{r0['shape']}`)", "",
        f"CPU: {machine['model']} (flags: {', '.join(machine['flags']) or 'none of avx2/avx512/amx'}; "
        f"native bf16 matmuls: {'yes' if machine['fast_bf16'] else 'no'}). This core: matmul "
        f"{peaks['matmul_gflops_float32']:.0f} GFLOP/s fp32, {peaks['matmul_gflops_bfloat16']:.1f} GFLOP/s bf16; "
        f"copy {peaks['copy_gbps']:.1f} GB/s. Seconds per step: the training thread's CPU seconds (wall seconds in "
        "brackets: other jobs on the machine inflate them), mean over the steps after the first. Bound: FLOPs as "
        "TRL trains (every prompt token once per completion) at the training dtype's peak + the decode's weight "
        "reads at the copy bandwidth.", "",
        "| setting | credit | step | ratio to bound | generate | credit | loss fwd | loss bwd | optimizer | "
        "peak RSS GB | rows | prompt tok | completion tok | bound s | AdamW steps lost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m, b = r["mean"], r["bounds"]
        lines.append(
            f"| {r['setting']} | `{r['credit']}` | {m['total_cpu']:.1f} ({m['total']:.1f}) | "
            f"{m['total_cpu'] / b['bound_s']:.2f} | {m['generate_cpu']:.1f} | {m['credit_cpu']:.2f} | "
            f"{m['forward_cpu']:.1f} | {m['backward_cpu']:.1f} | {m['optimizer_cpu']:.2f} | {r['peak_rss_gb']:.1f} | "
            f"{m['rows']:.0f} | {m['prompt']:.0f} | {m['completion']:.0f} | {b['bound_s']:.1f} | "
            f"{100 * r['frac_updates_lost']:.1f} % at lr {r['lr']:g} |")
    lines += ["", "Settings:", *[f"- `{name}`: {SETTINGS[name][0]}" for name in dict.fromkeys(
        r["setting"] for r in results)]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/lm_step")
    ap.add_argument("--shape", choices=SHAPES, default="bench")
    ap.add_argument("--settings", default="trl,before,oar")
    ap.add_argument("--credits", default="grpo", help="comma-separated; run one after another in each setting")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run one setting in this process, print its JSON
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_setting(a.one, a.shape, a.credits.split(","), a.steps)))
        return
    unknown = sorted(set(a.settings.split(",")) - set(SETTINGS))
    if unknown:
        sys.exit(f"unknown setting(s) {unknown}; settings: {', '.join(SETTINGS)}")
    from oar.cpu import fast_bf16
    from oar.files import atomic_write

    machine = {**cpu_features(), "fast_bf16": fast_bf16()}
    peaks = machine_peaks()
    print(f"CPU {machine['model']} {machine['flags']} fast bf16: {machine['fast_bf16']}; peaks {peaks}", flush=True)
    results = []
    for name in a.settings.split(","):
        cmd = [sys.executable, __file__, "--one", name, "--shape", a.shape, "--steps", str(a.steps),
               "--credits", a.credits]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if out.returncode:
            sys.exit(f"setting {name} failed:\n{out.stderr[-3000:]}")
        for r in json.loads(out.stdout.strip().splitlines()[-1]):
            r["bounds"] = bounds(r, peaks)
            results.append(r)
            m = r["mean"]
            print(f"{name:16s} {r['credit']:18s} step {m['total_cpu']:6.1f} CPU-s ({m['total']:6.1f} s) "
                  f"bound {r['bounds']['bound_s']:5.1f}  generate {m['generate_cpu']:5.1f}  forward "
                  f"{m['forward_cpu']:5.1f}  backward {m['backward_cpu']:5.1f}  peak {r['peak_rss_gb']:.1f} GB",
                  flush=True)
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path.with_suffix(".json"), json.dumps({"machine": machine, "peaks": peaks, "results": results},
                                                       indent=1))
    atomic_write(path.with_suffix(".md"), markdown(results, peaks, machine))
    print(markdown(results, peaks, machine))


if __name__ == "__main__":
    main()
