"""Where in the chain do OAR's weights go? Mean weight of the pivotal tokens of each solution step, by the step's
distance from the answer (1 = the last step), on the worked solutions of a lab regime's warm start.

Usage: ``OMP_NUM_THREADS=1 python docs/studies/fidelity/lab_score_by_step.py --regime long [--problems 64]
[--credits oar-p,oar-g,random] [--out FILE.json]``. A weight above 1 is more than the uniform share.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

from oar.credit import get_credit
from oar.files import atomic_write
from oar.lab.fidelity import weight_by_step
from oar.lab.regimes import apply_regime
from oar.lab.task import make_split
from oar.lab.warmstart import WarmStartConfig, warm_start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--regime", default="long")
    ap.add_argument("--problems", type=int, default=64)
    ap.add_argument("--credits", default="oar-p,oar-g,random")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    for c in args.credits.split(","):
        get_credit(c.partition("@")[0])  # ValueError naming an unknown one, before the warm start
    if args.problems < 1:
        ap.error(f"--problems must be >= 1, got {args.problems}")
    torch.set_num_threads(1)
    cfg = apply_regime(WarmStartConfig(), args.regime)
    model, tok, path = warm_start(cfg, progress=False)
    problems = make_split(replace(cfg.task, slip_rate=0.0), "test", args.problems)
    result = weight_by_step(model, tok, problems, scorers=tuple(args.credits.split(",")))
    ks = sorted({k for d in result.values() for k in d})
    print(f"warm start {path.name}, regime {args.regime}, {args.problems} worked solutions: mean weight of the "
          "pivotal tokens by the step's distance from the answer (1 = last step)")
    print("| credit | " + " | ".join(str(k) for k in ks) + " |\n|---|" + "---|" * len(ks))
    for name, d in result.items():
        print(f"| {name} | " + " | ".join(f"{d[k]:.2f}" if k in d else "–" for k in ks) + " |")
    if args.out:
        atomic_write(args.out, json.dumps({"warm_start": path.name, "regime": args.regime,
                                           "problems": args.problems, "weight_by_step_from_end": result}, indent=1))


if __name__ == "__main__":
    main()
