"""Where the time of a SmolLM2 GRPO step goes on this CPU, before and after oar's CPU defaults (issue #30).

Each setting trains a few steps of ``oar train``'s trainer (``build_trainer``: SmolLM2-135M-Instruct on the bundled
``easy-arithmetic`` set, one torch thread) in its own process and times the parts of every step: generation (TRL's
``_generate_single_turn``), rewards, token credit, the loss forward, the backward and the optimizer step; the
first step is a warm-up and is left out. It also measures this core's matmul peak (fp32, bf16) and copy bandwidth,
and turns the step's token counts into the step's FLOP bound (6·N FLOPs per trained token, 2·N per generated token)
and the decode's bandwidth bound (every decode step reads all the weights once), and counts the parameter updates
that pure bf16 weights lose (an AdamW step smaller than half a bf16 ulp rounds away).

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/bench_lm_step.py --out docs/results/lm_step

Writes ``OUT.json`` and ``OUT.md``. Pin it to one idle core: decode is memory-bound, so a busy second core
changes the figures.
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

# name -> (what it is, oar train overrides); "trl" is what oar train ran before this change (TRL's defaults:
# gradient checkpointing on, float32, transformers' generate on the policy)
SETTINGS: dict[str, tuple[str, dict]] = {
    "trl": ("TRL defaults: fp32, gradient checkpointing, generate on the policy",
            {"gradient_checkpointing": True, "bf16": False}),
    "fp32": ("fp32, no gradient checkpointing", {"gradient_checkpointing": False, "bf16": False}),
    "bf16-weights": ("pure bf16 weights (loses updates)", {"gradient_checkpointing": False, "bf16": False,
                                                           "dtype": "bfloat16"}),
    "autocast": ("bf16 autocast, fp32 master weights", {"gradient_checkpointing": False, "bf16": True}),
    "autocast+copy": ("bf16 autocast + bf16 rollout copy with oar's sampler (oar train's CPU default)",
                      {"gradient_checkpointing": False, "bf16": True, "oar_rollout_dtype": "bfloat16"}),
    "fp32+copy": ("fp32 + bf16 rollout copy", {"gradient_checkpointing": False, "bf16": False,
                                               "oar_rollout_dtype": "bfloat16"}),
}
PARTS = ("generate", "reward", "credit", "forward", "backward", "optimizer")


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


def run_setting(name: str, steps: int, prompts: int, group: int, max_len: int, credit: str) -> dict:
    """Train ``steps`` steps under setting ``name``; per-step seconds of each part (first step dropped)."""
    import torch
    from transformers import TrainerCallback

    from oar.quiet import quiet_libraries
    from oar.train_run import TrainArguments, build_trainer
    from oar.trainer import OARConfig

    torch.set_num_threads(1)
    overrides = dict(SETTINGS[name][1])
    dtype = overrides.pop("dtype", None)
    config = OARConfig(
        output_dir=f"/tmp/oar-bench-lm-step/{name}", credit=credit, use_cpu=True, seed=0, max_steps=steps,
        per_device_train_batch_size=prompts * group, num_generations=group, max_completion_length=max_len,
        learning_rate=1e-5, beta=0.0, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        **overrides,
    )
    script = TrainArguments(model="smollm2", dataset="easy-arithmetic", dtype=dtype)
    times: dict[str, float] = {}
    tokens: dict[str, float] = {}
    rows: list[dict] = []

    def timed(part, f):
        @functools.wraps(f)
        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                times[part] = times.get(part, 0.0) + time.perf_counter() - t
        return g

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            times.clear()
            self.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            self.t_opt = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kw):
            times["optimizer"] = time.perf_counter() - self.t_opt

        def on_step_end(self, args, state, control, **kw):
            rows.append({"step": state.global_step, "total": time.perf_counter() - self.t0, **times,
                         **{k: v for k, v in tokens.items()}})

    with quiet_libraries(False):
        trainer = build_trainer(script, config, callbacks=[Clock()])
    policy = trainer.accelerator.unwrap_model(trainer.model)
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    trainer._generate_single_turn = timed("generate", trainer._generate_single_turn)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    trainer._token_credit = timed("credit", trainer._token_credit)
    trainer.compute_loss = timed("forward", trainer.compute_loss)
    trainer.accelerator.backward = timed("backward", trainer.accelerator.backward)
    score = trainer._generate_and_score_completions

    def count(inputs):
        out = score(inputs)
        tokens["gen_tokens"] = float(out["completion_mask"].sum())
        tokens["train_tokens"] = float(out["completion_mask"].sum() + out["prompt_mask"].sum())
        tokens["decode_steps"] = float(out["completion_ids"].shape[1])
        return out

    trainer._generate_and_score_completions = count
    with quiet_libraries(False):
        trainer.train()
    lost, total = lost_updates(before.values(), config.learning_rate)
    n_params = sum(p.numel() for p in policy.parameters())
    kept = rows[1:] if len(rows) > 1 else rows
    mean = {k: sum(r.get(k, 0.0) for r in kept) / len(kept) for k in ("total", *PARTS, "gen_tokens",
                                                                     "train_tokens", "decode_steps")}
    mean["other"] = mean["total"] - sum(mean[p] for p in PARTS)
    mean["gen_tokens_per_s"] = mean["gen_tokens"] / mean["generate"] if mean["generate"] else None
    return {"setting": name, "what": SETTINGS[name][0], "steps": rows, "mean": mean, "params": n_params,
            "frac_updates_lost": lost / total if total else None, "lr": config.learning_rate, "credit": credit,
            "shape": {"prompts": prompts, "group": group, "max_completion_length": max_len}}


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
    """The step's compute bound at this core's bf16 and fp32 matmul peaks, and the decode's bandwidth bound
    (bf16 weights read once per decode step)."""
    m, n = result["mean"], result["params"]
    flops = 6 * n * m["train_tokens"] + 2 * n * m["gen_tokens"]
    return {
        "step_flops": flops,
        "bound_s_bf16": flops / (peaks["matmul_gflops_bfloat16"] * 1e9),
        "bound_s_fp32": flops / (peaks["matmul_gflops_float32"] * 1e9),
        "decode_bound_s_bf16": m["decode_steps"] * n * 2 / (peaks["copy_gbps"] / 2 * 1e9),
    }


def markdown(results: list[dict], peaks: dict) -> str:
    shape = results[0]["shape"]
    lines = [
        "# SmolLM2-135M GRPO step on one CPU core (benchmarks/bench_lm_step.py)", "",
        f"{shape['prompts']} prompts × {shape['group']} completions, up to {shape['max_completion_length']} new "
        f"tokens, credit `{results[0]['credit']}`, bundled `easy-arithmetic`, one torch thread; seconds per step, "
        "mean over the steps after the first.",
        f"This core: matmul {peaks['matmul_gflops_float32']:.0f} GFLOP/s fp32, "
        f"{peaks['matmul_gflops_bfloat16']:.0f} GFLOP/s bf16; copy {peaks['copy_gbps']:.1f} GB/s.", "",
        "| setting | step | generate | tok/s | reward | credit | forward | backward | optimizer | other |"
        " FLOP bound (bf16) | AdamW steps lost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m, b = r["mean"], r["bounds"]
        lines.append(
            f"| {r['setting']} | {m['total']:.1f} | {m['generate']:.1f} | {m['gen_tokens_per_s']:.0f} | "
            f"{m['reward']:.2f} | {m['credit']:.2f} | {m['forward']:.1f} | {m['backward']:.1f} | "
            f"{m['optimizer']:.2f} | {m['other']:.1f} | {b['bound_s_bf16']:.1f} | "
            f"{100 * r['frac_updates_lost']:.1f} % at lr {r['lr']:g} |")
    lines += ["", "Settings:", *[f"- `{r['setting']}`: {r['what']}" for r in results]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/lm_step")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, default=96)
    ap.add_argument("--credit", default="grpo")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # run one setting in this process, print its JSON
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_setting(a.one, a.steps, a.prompts, a.group, a.max_completion_length, a.credit)))
        return
    from oar.files import atomic_write

    peaks = machine_peaks()
    results = []
    for name in a.settings.split(","):
        cmd = [sys.executable, __file__, "--one", name, "--steps", str(a.steps), "--prompts", str(a.prompts),
               "--group", str(a.group), "--max-completion-length", str(a.max_completion_length),
               "--credit", a.credit]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if out.returncode:
            sys.exit(f"setting {name} failed:\n{out.stderr[-3000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["bounds"] = bounds(r, peaks)
        results.append(r)
        m = r["mean"]
        print(f"{name:14s} step {m['total']:5.1f} s  generate {m['generate']:5.1f} s "
              f"({m['gen_tokens_per_s']:.0f} tok/s)  forward {m['forward']:4.1f}  backward {m['backward']:4.1f}  "
              f"optimizer {m['optimizer']:.2f}", flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out.with_suffix(".json"), json.dumps({"peaks": peaks, "results": results}, indent=1))
    atomic_write(out.with_suffix(".md"), markdown(results, peaks))
    print(markdown(results, peaks))


if __name__ == "__main__":
    main()
