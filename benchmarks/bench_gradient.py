"""OAR-G cost relative to one policy forward+backward on the same batch (the goal is <= 1.1).

    python benchmarks/bench_gradient.py [--batch 4 --hidden 256 --layers 4 --prompt 128 --reasoning 512]
        [--vocab 49152] [--repeats 3] [--device cpu] [--threads 1]

The policy step is what a GRPO update does per micro-batch: full logits, token log-probs of the
sequence, ``backward()`` into the parameters. OAR-G is timed for the paper's mode (``answer_mean``:
a clean no-grad forward plus a forward/backward to the input embeddings) and for ``answer_joint``
with ``noise_std=0`` (no clean forward). Median of ``--repeats`` after one warm-up. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from _probes import build_model, make_probes
from oar import gradient_scores


def timed(fn, repeats: int, cuda: bool) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--reasoning", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    model = build_model(args.vocab, args.hidden, args.layers, args.device, getattr(torch, args.dtype))
    ids, am, rm, ans = make_probes(args.batch, args.prompt, args.reasoning, 16, 3, args.vocab, args.device,
                                   ragged=True)

    def policy_step() -> None:
        logits = model(ids, attention_mask=am).logits[:, :-1].float()
        token_lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        mask = am[:, 1:].float()
        (-(token_lp * mask).sum() / mask.sum()).backward()
        model.zero_grad(set_to_none=True)

    def oar_g(mode: str, noise_std: float):
        gen = torch.Generator(device=args.device).manual_seed(0)
        return lambda: gradient_scores(model, ids, am, rm, ans, mode=mode, noise_std=noise_std, generator=gen)

    policy = timed(policy_step, args.repeats, cuda)
    mean = timed(oar_g("answer_mean", 1e-3), args.repeats, cuda)
    joint = timed(oar_g("answer_joint", 0.0), args.repeats, cuda)
    print(json.dumps({
        "config": vars(args),
        "tokens": int(am.sum()),
        "policy_fwd_bwd_s": round(policy, 3),
        "oar_g_answer_mean_s": round(mean, 3),
        "oar_g_answer_joint_s": round(joint, 3),
        "ratio_answer_mean": round(mean / policy, 3),
        "ratio_answer_joint": round(joint / policy, 3),
    }, indent=1))


if __name__ == "__main__":
    main()
