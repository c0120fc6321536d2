"""OAR-P fast path vs the naive definition on the same probes: time and peak memory.

    python benchmarks/bench_perturbation.py [--hidden 256 --layers 4 --prompt 128 --reasoning 512]
        [--vocab 49152] [--chunk-size 16] [--naive-copies 64] [--device cpu] [--threads 1]

The naive definition costs one full forward (full logits) per perturbed copy, the same for every copy,
so on a CPU it is timed on ``--naive-copies`` reasoning positions and extrapolated linearly to all of
them (0 = run every copy); the fast path always runs every position. Agreement is checked on the timed
positions. Peak memory: each method runs in its own subprocess (peak resident memory above the loaded model on CPU,
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

from _probes import PeakMemory, build_model, make_probes
from oar import perturbation_scores, perturbation_scores_naive


def run_one(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    model = build_model(args.vocab, args.hidden, args.layers, args.device, getattr(torch, args.dtype))
    ids, am, rm, ans = make_probes(1, args.prompt, args.reasoning, 16, 3, args.vocab, args.device)
    if args.method == "naive" and args.naive_copies:
        keep = rm.nonzero()[torch.linspace(0, args.reasoning - 1, args.naive_copies).long()]
        rm = torch.zeros_like(rm)
        rm[keep[:, 0], keep[:, 1]] = True
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        host = PeakMemory()
        host.start()
    t0 = time.perf_counter()
    if args.method == "fast":
        scores = perturbation_scores(model, ids, am, rm, ans, mode=args.mode, chunk_size=args.chunk_size)
    else:
        scores = perturbation_scores_naive(model, ids, am, rm, ans, mode=args.mode)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else host.peak_mib()
    copies = int(rm.sum())
    return {"seconds": seconds, "copies": copies, "peak_mib": peak, "scores": scores[rm].tolist(),
            "positions": rm.nonzero()[:, 1].tolist()}


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
    ap.add_argument("--method", choices=["fast", "naive"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.method:
        print(json.dumps(run_one(args)))
        return
    out = {}
    for method in ("fast", "naive"):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--method", method]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        out[method] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
    fast, naive = out["fast"], out["naive"]
    fast_at = dict(zip(fast["positions"], fast["scores"], strict=True))
    diff = max(abs(fast_at[p] - s) for p, s in zip(naive["positions"], naive["scores"], strict=True))
    naive_all = naive["seconds"] * fast["copies"] / naive["copies"]
    print(json.dumps({
        "config": {k: v for k, v in vars(args).items() if k != "method"},
        "fast_s": round(fast["seconds"], 2),
        "naive_s_measured": round(naive["seconds"], 2),
        "naive_copies_measured": naive["copies"],
        "naive_s_all_copies": round(naive_all, 2),
        "speedup": round(naive_all / fast["seconds"], 2),
        "fast_peak_mib": round(fast["peak_mib"], 1),
        "naive_peak_mib": round(naive["peak_mib"], 1),
        "max_abs_diff": diff,
        "max_abs_score": max(abs(s) for s in naive["scores"]),
    }, indent=1))


if __name__ == "__main__":
    main()
