"""``oar train``: GRPO with OAR token credit. Parsing and wiring only; the work is in :mod:`oar.train_run`.

Every ``OARConfig`` / ``GRPOConfig`` field is an option (``--credit oar-p@horizon=2``, ``--loss_type dapo``, ...),
read by TRL's own parser, so ``--config FILE.yaml`` and overrides work exactly as in TRL's scripts. Taken out before
TRL's parser sees the arguments: ``--verbose`` keeps the libraries' own warnings, logs and progress bars;
``--import MODULE`` (repeatable) imports a module registering its own credit methods first.
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


def split_oar_options(argv: list[str]) -> tuple[list[str], bool, list[str]]:
    """``argv`` without ``oar``'s own options, whether ``--verbose`` was given, and the ``--import`` modules
    (``--import MODULE`` or ``--import=MODULE``). ValueError for an ``--import`` without a module."""
    rest, modules, verbose = [], [], False
    it = iter(argv)
    for arg in it:
        if arg == "--verbose":
            verbose = True
        elif arg == "--import":
            module = next(it, None)
            if module is None or module.startswith("--"):
                raise ValueError("--import needs a module name (--import MODULE)")
            modules.append(module)
        elif arg.startswith("--import="):
            modules.append(arg.partition("=")[2])
        else:
            rest.append(arg)
    return rest, verbose, modules


def run(args: argparse.Namespace) -> int:
    from oar.cli.parser import import_user_modules, one_line_errors
    from oar.quiet import quiet_libraries
    from oar.train_run import parse_train_args, run_training

    argv, verbose, modules = split_oar_options(args.argv)
    import oar.lab  # noqa: F401  (every credit `oar credits` lists is known, so a lab-only one is named as such)

    import_user_modules("oar train", modules)  # before OARConfig checks the credit name
    # TRL's parser, built in oar.train_run, reports a bad option in one line too; building the config raises
    # transformers' deprecation warnings, which quiet_libraries drops
    with quiet_libraries(verbose), one_line_errors():
        script_args, config = parse_train_args(argv)
    method = config.resolved_credit.method
    if method.lab_only:
        raise ValueError(f"credit {config.credit!r} is lab-only: it reads the arithmetic lab's ground truth, so it "
                         f"trains on the lab's task alone; compare it there: oar compare --credits "
                         f"grpo,{config.credit}")
    with quiet_libraries(verbose):
        summary = run_training(script_args, config)
    print("oar train: done")
    print(json.dumps(summary, indent=2))
    return 0
