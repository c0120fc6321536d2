"""``oar compare``: GRPO vs OAR on the arithmetic lab (CPU, offline); logic in :mod:`oar.lab.compare`."""

from __future__ import annotations

import argparse
import sys

from oar.cli.parser import add_import_option


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("compare", help="train GRPO and OAR side by side on the arithmetic lab")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_const", dest="preset", const="quick",
                      help="CI smoke comparison (about 3 minutes)")
    mode.add_argument("--study", action="store_const", dest="preset", const="study",
                      help="6 seeds, 3 credits, 300 s per run (about 52 minutes on 2 cores)")
    p.set_defaults(preset="default", func=run)
    p.add_argument("--credits", help="comma-separated credits, each NAME or NAME@OPT=VALUE&OPT=VALUE (a method or "
                   "control with its options: its own column), e.g. grpo,oar-g,oar-g@tau=0.5&beta=2,shuffle:oar-g "
                   "(`oar credits` lists them; default: the preset's)")
    p.add_argument("--seeds", type=int, help="seeds per credit (default: the preset's)")
    p.add_argument("--budget", type=float, help="training seconds per run, evaluation excluded")
    p.add_argument("--max-steps", type=int, dest="max_steps",
                   help="stop every run at this many updates (or at --budget, whichever comes first): the "
                   "equal-updates view at the end of the runs")
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                   help="how a run's training seconds are counted: its training thread's CPU time (default; "
                   "unaffected by other jobs on the machine) or wall-clock time")
    p.add_argument("--verbosity", type=int, help="filler phrases per solution step (default 1)")
    p.add_argument("--regime", help="lab regime (oar.lab.regimes): default, terse, long, distract, verbose, chain10, "
                   "or long-b16, the headroom cell, which also sets its batch shape, lr, budget and evaluation "
                   "(--quick keeps its own budget and evaluation)")
    p.add_argument("--lab", default="char", choices=("char", "smollm2"),  # oar.lab.lm.LABS (a test holds them equal)
                   help="the model: 'char', the character lab's tiny model (default), or 'smollm2', the "
                   "language-model lab (SmolLM2-135M-Instruct through its chat template, its own warm start, "
                   "recipe and protocol; a --regime gives it its task only)")
    p.add_argument("--warm-seeds", type=int, default=1, dest="warm_seeds",
                   help="warm starts (SFT seeds 0..N-1, each cached): every credit runs --seeds RL seeds from each, "
                   "and every interval is over the (warm start, RL seed) units (default 1: warm start 0)")
    p.add_argument("--workers", type=int, help="parallel single-thread runs (default 2; with --backend ray, as "
                   "many as the cluster has CPUs)")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="where the runs train: this machine's process pool (default) or a Ray cluster, one task "
                   "per run (needs oar-rl[ray]; docs/scaling.md)")
    p.add_argument("--address", help="--backend ray: the Ray cluster to join (default: RAY_ADDRESS if set, else a "
                   "new local Ray instance)")
    p.add_argument("--retries", type=int, help="--backend ray: attempts after a run's first failure (default 2)")
    p.add_argument("--gpus-per-run", type=float, dest="gpus_per_run",
                   help="--backend ray: GPUs each run reserves (default 0; the arithmetic lab trains on the CPU)")
    p.add_argument("--out", default="runs/compare", help="output directory (default runs/compare)")
    p.add_argument("--resume", action="store_true",
                   help="keep finished runs in --out that have the same configuration (continue an interrupted run)")
    p.add_argument("--verbose", action="store_true",
                   help="show the libraries' own warnings, logs and progress bars (hidden by default)")
    add_import_option(p)


def run(args: argparse.Namespace) -> int:
    from oar.cli.parser import import_user_modules
    from oar.lab.compare import RunsFailed, base_config, compare, get_preset
    from oar.lab.ray_pool import RayOptions
    from oar.lab.summary import print_summary

    import_user_modules("oar compare", args.modules)
    credits = tuple(c.strip() for c in args.credits.split(",") if c.strip()) if args.credits else None
    if args.credits is not None and not credits:
        raise ValueError(f"--credits is empty: {args.credits!r}")
    ray_only = {"--address": args.address, "--retries": args.retries, "--gpus-per-run": args.gpus_per_run}
    if args.backend != "ray" and any(v is not None for v in ray_only.values()):
        raise ValueError(f"{', '.join(k for k, v in ray_only.items() if v is not None)} needs --backend ray")
    preset = get_preset(args.preset)
    given = {"budget_s": args.budget, "max_steps": args.max_steps}
    overrides = {"clock": args.clock, **{k: v for k, v in given.items() if v is not None}}
    if args.verbosity is not None:
        overrides["task"] = {"verbosity": args.verbosity}
    base = base_config(preset, args.regime, overrides, lab=args.lab)  # every override in one dict, checked first
    ray = None
    if args.backend == "ray":
        ray = RayOptions(address=args.address, **({"retries": args.retries} if args.retries is not None else {}),
                         gpus_per_run=args.gpus_per_run or 0.0)
    try:
        results = compare(args.out, base, credits or preset.credits,
                          seeds=preset.seeds if args.seeds is None else args.seeds, workers=args.workers,
                          resume=args.resume, verbose=args.verbose, imports=tuple(args.modules), ray=ray,
                          warm_seeds=args.warm_seeds)
    except RunsFailed as err:  # what finished is written and summarised; the failed runs are named
        if err.results is not None:
            print_summary(err.results, args.out)
        print(f"oar compare: error: {err}", file=sys.stderr)
        return 1
    print_summary(results, args.out)
    return 0
