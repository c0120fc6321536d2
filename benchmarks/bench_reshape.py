"""Throughput of bilevel_weights on a padded [256, 4096] batch (CPU, one thread by default).

    python benchmarks/bench_reshape.py [--rows 256] [--cols 4096] [--repeats 20] [--threads 1]

Prints rows/s and ms per call for float32 and float64; writes nothing.
"""

from __future__ import annotations

import argparse
import time

import torch

from oar import bilevel_weights


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(args.cols // 8, args.cols + 1, (args.rows,), generator=gen)
    mask = torch.arange(args.cols)[None, :] < lengths[:, None]  # ragged rows, right padding
    for dtype in (torch.float32, torch.float64):
        scores = torch.rand(args.rows, args.cols, generator=gen, dtype=dtype).pow(4)
        bilevel_weights(scores, mask)  # warm-up
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            bilevel_weights(scores, mask)
        dt = (time.perf_counter() - t0) / args.repeats
        print(f"{dtype}: [{args.rows}, {args.cols}] in {dt * 1e3:.1f} ms -> {args.rows / dt:,.0f} rows/s "
              f"({int(mask.sum()) / dt / 1e6:.1f} M reasoning tokens/s, {args.threads} thread)")


if __name__ == "__main__":
    main()
