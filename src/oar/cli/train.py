"""``oar train``: GRPO with OAR token credit. Parsing and wiring only; the work is in :mod:`oar.train_run`.

Every ``OARConfig`` / ``GRPOConfig`` field is an option (``--credit oar-p``, ``--loss_type dapo``, ...), read
by TRL's own parser, so ``--config FILE.yaml`` and overrides work exactly as in TRL's scripts; ``--verbose``
(taken out before TRL's parser sees the arguments) keeps the libraries' own warnings, logs and progress bars.
"""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    # '+' as prefix: every '--option' is handed to TRL's parser untouched (it prints the full --help)
    p = subparsers.add_parser(
        "train", help="train with GRPO + OAR token credit (--config FILE.yaml, --model, --dataset, overrides)",
        add_help=False, prefix_chars="+",
    )
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from oar.cli.parser import one_line_errors
    from oar.quiet import quiet_libraries
    from oar.train_run import parse_train_args, run_training

    verbose = "--verbose" in args.argv
    with one_line_errors():  # TRL's parser, built in oar.train_run, reports a bad option in one line too
        script_args, config = parse_train_args([a for a in args.argv if a != "--verbose"])
    with quiet_libraries(verbose):
        summary = run_training(script_args, config)
    print("oar train: done")
    print(json.dumps(summary, indent=2))
    return 0
