"""OAR-P fast path vs the naive definition on the same probes: time and peak memory.

    python benchmarks/bench_perturbation.py [--hidden 256 --layers 4 --prompt 128 --reasoning 512]
        [--vocab 49152] [--chunk-size 16] [--naive-copies 64] [--device cpu] [--threads 1]

The naive definition costs one full forward (full logits) per perturbed copy, the same for every copy,
so on a CPU it is timed on ``--naive-copies`` reasoning positions and extrapolated linearly to all of
them (0 = run every copy); the fast path always runs every position. Both are timed in this process,
alternating, best of ``--repeats``; agreement is checked on the naive positions. Peak memory: each
method runs once more in its own subprocess (peak resident memory above the loaded model on CPU,
``max_memory_allocated`` on CUDA). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from _probes import build_model, make_probes
from oar import perturbation_scores
from oar.importance import perturbation_scores_naive
from oar.peak_memory import PeakMemory


def setup(args: argparse.Namespace, method: str):
    """Model and probe; the naive method keeps only ``--naive-copies`` evenly spaced reasoning positions."""
    torch.set_num_threads(args.threads)
    model = build_model(args.vocab, args.hidden, args.layers, args.device, getattr(torch, args.dtype))
    ids, am, rm, ans = make_probes(1, args.prompt, args.reasoning, 16, 3, args.vocab, args.device)
    if method == "naive" and args.naive_copies:
        keep = rm.nonzero()[torch.linspace(0, args.reasoning - 1, args.naive_copies).long()]
        rm = torch.zeros_like(rm)
        rm[keep[:, 0], keep[:, 1]] = True
    return model, (ids, am, rm, ans)


def score(args: argparse.Namespace, method: str, model, probes) -> torch.Tensor:
    if method == "fast":
        return perturbation_scores(model, *probes, mode=args.mode, chunk_size=args.chunk_size)
    return perturbation_scores_naive(model, *probes, mode=args.mode)


def peak_memory(args: argparse.Namespace, method: str) -> float:
    """Peak memory (MiB) of one scoring call above the loaded model and probes (run in a subprocess)."""
    model, probes = setup(args, method)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        host = PeakMemory()
        host.start()
    score(args, method, model, probes)
    if cuda:
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    return host.peak_mib()


def timed(args: argparse.Namespace, method: str, model, probes) -> tuple[float, torch.Tensor]:
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    scores = score(args, method, model, probes)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0, scores


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--reasoning", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--mode", default="last")
    ap.add_argument("--chunk-size", type=int, default=16)
    ap.add_argument("--naive-copies", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--memory-of", choices=["fast", "naive"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_of:
        print(json.dumps(peak_memory(args, args.memory_of)))
        return
    # time: both methods in this process, alternating, best of --repeats (the machine may be shared)
    model, probes = setup(args, "fast")
    _, naive_probes = setup(args, "naive")
    best = {"fast": float("inf"), "naive": float("inf")}
    for _ in range(args.repeats):
        for method, p in (("naive", naive_probes), ("fast", probes)):
            seconds, scores = timed(args, method, model, p)
            best[method] = min(best[method], seconds)
            if method == "fast":
                fast_scores = scores
            else:
                naive_scores = scores
    rm_naive = naive_probes[2]
    diff = float((fast_scores[rm_naive] - naive_scores[rm_naive]).abs().max())
    copies, measured = int(probes[2].sum()), int(rm_naive.sum())
    naive_all = best["naive"] * copies / measured
    # memory: each method in a fresh process, with large blocks mmap-ed so RSS follows live tensors
    peak = {}
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    for method in ("fast", "naive"):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--memory-of", method]
        peak[method] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
    print(json.dumps({
        "config": {k: v for k, v in vars(args).items() if k != "memory_of"},
        "fast_s": round(best["fast"], 2),
        "naive_s_measured": round(best["naive"], 2),
        "naive_copies_measured": measured,
        "naive_s_all_copies": round(naive_all, 2),
        "speedup": round(naive_all / best["fast"], 2),
        "fast_peak_mib": round(peak["fast"], 1),
        "naive_peak_mib": round(peak["naive"], 1),
        "max_abs_diff": diff,
        "max_abs_score": float(naive_scores[rm_naive].abs().max()),
    }, indent=1))


if __name__ == "__main__":
    main()
