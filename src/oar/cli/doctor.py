"""``oar doctor``: check the installation (versions, supported TRL range) and run the core once."""

from __future__ import annotations

import argparse
import importlib.metadata as md


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("doctor", help="check versions and run the core math once")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from oar import bilevel_weights, group_advantages, weight_stats

    for dist in ("oar-rl", "torch", "trl", "transformers", "accelerate", "datasets", "peft", "math-verify"):
        try:
            print(f"{dist:>13} {md.version(dist)}")
        except md.PackageNotFoundError:
            print(f"{dist:>13} not installed")
    gen = torch.Generator().manual_seed(0)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    adv = group_advantages(rewards, group_size=4)
    scores = torch.rand(8, 32, generator=gen) ** 3
    mask = torch.ones(8, 32, dtype=torch.bool)
    w = bilevel_weights(scores, mask)
    stats = weight_stats(w, mask)
    print("advantages:", [round(a, 3) for a in adv.tolist()])
    print("weights:", {k: round(v, 3) for k, v in stats.items()})
    ok = abs(stats["mean"] - 1.0) < 1e-5
    print("core ok" if ok else "core FAILED: masked mean weight != 1")
    return 0 if ok else 1
