"""``oar compare``: GRPO vs OAR on the arithmetic lab (CPU, offline); logic in :mod:`oar.lab.compare`."""

from __future__ import annotations

import argparse

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
    p.add_argument("--lab", default="char", choices=("char", "smollm2"),
                   help="the model: 'char', the character lab's tiny model (default), or 'smollm2', the "
                   "language-model lab (SmolLM2-135M-Instruct through its chat template, its own warm start, "
                   "recipe and protocol; a --regime gives it its task only)")
    p.add_argument("--workers", type=int, default=2, help="parallel single-thread runs (default 2)")
    p.add_argument("--out", default="runs/compare", help="output directory (default runs/compare)")
    p.add_argument("--resume", action="store_true",
                   help="keep finished runs in --out that have the same configuration (continue an interrupted run)")
    p.add_argument("--verbose", action="store_true",
                   help="show the libraries' own warnings, logs and progress bars (hidden by default)")
    add_import_option(p)


def run(args: argparse.Namespace) -> int:
    from oar.lab.compare import compare
    from oar.lab.summary import print_summary

    credits = tuple(c.strip() for c in args.credits.split(",") if c.strip()) if args.credits else None
    if args.credits is not None and not credits:
        raise ValueError(f"--credits is empty: {args.credits!r}")
    overrides = {"clock": args.clock, **({"max_steps": args.max_steps} if args.max_steps is not None else {})}
    results = compare(args.out, preset=args.preset, credits=credits, seeds=args.seeds, budget_s=args.budget,
                      verbosity=args.verbosity, workers=args.workers, resume=args.resume, regime=args.regime,
                      run_overrides=overrides, verbose=args.verbose, imports=tuple(args.modules), lab=args.lab)
    print_summary(results, args.out)
    return 0
