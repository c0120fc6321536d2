"""OAR's attribution on the language-model lab's warm start (SmolLM2-135M-Instruct, issue #30 §2).

Usage: ``OMP_NUM_THREADS=1 python docs/studies/lm-lab/lm_attribution.py [--problems 128] [--warm-seed 0]
[--localisation] [--by-step] [--out FILE]``. Scores the worked solutions of held-out problems with the cached LM
warm start (trained on first use, ~15 min) and reports, per credit: AUC of pivotal tokens over filler and over
distractors (``--distractors 1`` puts distractors in the solutions), the mean weight per token kind, CPU seconds
per solution, with ``--localisation`` how often the largest weight of a failed sample lands on its first wrong
step, next to chance, and with ``--by-step`` (alone) the mean weight of each step's pivotal tokens by its distance
from the answer on clean solutions (:mod:`oar.lab.fidelity`, the character lab's diagnostics on BPE tokens).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch

from oar.files import atomic_write
from oar.lab.fidelity import attribution_fidelity, localisation, weight_by_step
from oar.lab.lm import LMWarmStartConfig, lm_warm_start
from oar.lab.task import make_split, max_completion_chars

SCORERS = ("oar-p", "oar-p@horizon=2", "oar-g", "oar-g@mode=last", "oar-prefix", "entropy", "random")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=128)
    ap.add_argument("--warm-seed", type=int, default=0)
    ap.add_argument("--distractors", type=int, default=1, help="distractor phrases per step in the scored solutions")
    ap.add_argument("--localisation", action="store_true")
    ap.add_argument("--by-step", action="store_true", help="only the weight by step (no fidelity)")
    ap.add_argument("--scorers", default=",".join(SCORERS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = LMWarmStartConfig(seed=args.warm_seed)
    model, tok, path = lm_warm_start(cfg)
    scorers = tuple(args.scorers.split(","))
    task = replace(cfg.task, slip_rate=0.0, distractors=args.distractors)
    problems = make_split(task, "test", args.problems, seed=0)
    t0 = time.perf_counter()
    if args.by_step:
        clean = make_split(replace(cfg.task, slip_rate=0.0), "test", args.problems, seed=0)
        result = {"warm_start": str(path), "problems": args.problems,
                  "weight_by_step_from_end": weight_by_step(model, tok, clean, scorers=scorers, batch_size=16)}
        print(json.dumps(result, indent=1), flush=True)
        if args.out:
            atomic_write(args.out, json.dumps(result | {"seconds": time.perf_counter() - t0}, indent=1))
        return
    result = {"warm_start": str(path), "problems": args.problems, "distractors": args.distractors,
              "fidelity": attribution_fidelity(model, tok, problems, scorers=scorers, batch_size=16)}
    print(json.dumps(result["fidelity"], indent=1), flush=True)
    if args.localisation:
        clean = make_split(replace(cfg.task, slip_rate=0.0), "test", args.problems, seed=0)
        result["localisation"] = localisation(model, tok, clean, scorers=scorers, k=4,
                                              max_new_tokens=max_completion_chars(cfg.task) + 8, batch_size=16)
        print(json.dumps(result["localisation"], indent=1), flush=True)
    result["seconds"] = time.perf_counter() - t0
    if args.out:
        atomic_write(args.out, json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
