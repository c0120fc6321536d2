"""Attribution fidelity on the lab: AUC of pivotal (operand / intermediate-result) tokens over filler, per credit.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/lab_fidelity.py [--problems 256] [--verbosity 2] [--out FILE]``.
Scores the worked solutions of held-out problems with the cached warm-started lab model (trained on first use).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch

from oar.lab.fidelity import FIDELITY_SCORERS, attribution_fidelity
from oar.lab.task import make_split
from oar.lab.warmstart import WarmStartConfig, warm_start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=256)
    ap.add_argument("--verbosity", type=int, default=None, help="default: the warm start's")
    ap.add_argument("--scorers", default=",".join(FIDELITY_SCORERS))
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = WarmStartConfig()
    if args.verbosity is not None:
        cfg = replace(cfg, task=replace(cfg.task, verbosity=args.verbosity))
    model, tok, path = warm_start(cfg)
    problems = make_split(replace(cfg.task, slip_rate=0.0), "test", args.problems)
    t0 = time.perf_counter()
    res = attribution_fidelity(model, tok, problems, tuple(args.scorers.split(",")))
    print(f"warm start {path.name}, {args.problems} held-out solutions, verbosity {cfg.task.verbosity}, "
          f"{time.perf_counter() - t0:.1f} s")
    print("| credit | AUC pivotal vs filler | AUC pivotal vs rest of reasoning | mean weight pivotal / structure / "
          "filler |\n|---|---|---|---|")
    for name, r in res.items():
        print(f"| {name} | {r['auc_filler']:.3f} | {r['auc_rest']:.3f} | {r['weight_pivotal']:.2f} / "
              f"{r['weight_structure']:.2f} / {r['weight_filler']:.2f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"warm_start": path.name, "verbosity": cfg.task.verbosity, "results": res}, f, indent=1)


if __name__ == "__main__":
    main()
