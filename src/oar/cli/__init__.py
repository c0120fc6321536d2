"""The ``oar`` command: argument parsing and wiring only; each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand name -> module exposing ``register(subparsers)`` (which sets ``func`` on its parser)
SUBCOMMANDS: dict[str, str] = {
    "doctor": "oar.cli.doctor",
    "eval": "oar.cli.eval",
    "train": "oar.cli.train",
    "attribute": "oar.cli.attribute",
    "report": "oar.cli.report",
    "compare": "oar.cli.compare",
    "credits": "oar.cli.credits",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oar", description="Outcome-grounded Advantage Reshaping for GRPO.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS.values():
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as err:  # user errors: one clear line, no traceback
        print(f"oar {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
