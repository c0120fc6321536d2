"""Attribution fidelity on the lab: AUC of pivotal (operand / intermediate-result) tokens over filler, per credit.

Usage: ``OMP_NUM_THREADS=1 python docs/studies/fidelity/lab_fidelity.py [--problems 256] [--regime long] [--verbosity 2]
[--localisation] [--out FILE]``. Scores the worked solutions of held-out problems with the cached warm-started
lab model of the regime (trained on first use); ``--localisation`` also samples the model and reports how often
each method's largest weight lands on the first wrong step of a failed sample (``oar.lab.fidelity.localisation``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch

from oar.files import atomic_write
from oar.lab.fidelity import FIDELITY_SCORERS, attribution_fidelity, localisation
from oar.lab.regimes import apply_regime
from oar.lab.task import make_split, max_completion_chars
from oar.lab.warmstart import WarmStartConfig, warm_start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=256)
    ap.add_argument("--regime", default=None, help="task regime of oar.lab.regimes (default: the default task)")
    ap.add_argument("--verbosity", type=int, default=None, help="default: the warm start's")
    ap.add_argument("--localisation", action="store_true", help="also the localisation rate on failed samples")
    ap.add_argument("--localisation-scorers", default="oar-g,oar-p,entropy,entropy-mask,random,shuffle:oar-g")
    ap.add_argument("--scorers", default=",".join(FIDELITY_SCORERS))
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = WarmStartConfig()
    if args.regime is not None:
        cfg = apply_regime(cfg, args.regime)  # ValueError naming the registered regimes
    if args.verbosity is not None:
        cfg = replace(cfg, task=replace(cfg.task, verbosity=args.verbosity))
    model, tok, path = warm_start(cfg)
    problems = make_split(replace(cfg.task, slip_rate=0.0), "test", args.problems)
    t0 = time.perf_counter()
    res = attribution_fidelity(model, tok, problems, tuple(args.scorers.split(",")))
    print(f"warm start {path.name}, {args.problems} held-out solutions, verbosity {cfg.task.verbosity}, "
          f"{time.perf_counter() - t0:.1f} s")
    print("| credit | AUC pivotal vs filler | AUC pivotal vs distractor | AUC pivotal vs rest of reasoning | mean "
          "weight pivotal / structure / filler / distractor |\n|---|---|---|---|---|")
    for name, r in res.items():
        print(f"| {name} | {r['auc_filler']:.3f} | {r['auc_distractor']:.3f} | {r['auc_rest']:.3f} | "
              f"{r['weight_pivotal']:.2f} / {r['weight_structure']:.2f} / {r['weight_filler']:.2f} / "
              f"{r['weight_distractor']:.2f} |")
    out = {"warm_start": path.name, "regime": args.regime or "default", "verbosity": cfg.task.verbosity,
           "problems": args.problems, "results": res}
    if args.localisation:
        loc = localisation(model, tok, problems, tuple(args.localisation_scorers.split(",")),
                           max_new_tokens=max_completion_chars(cfg.task) + 8)
        print("| credit | localisation rate | chance | mean weight of the wrong step | failed samples |\n"
              "|---|---|---|---|---|")
        for name, r in loc.items():
            print(f"| {name} | {r['rate']:.3f} | {r['chance']:.3f} | {r['weight_wrong_step']:.2f} | "
                  f"{r['completions']} |")
        out["localisation"] = loc
    if args.out:
        atomic_write(args.out, json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
