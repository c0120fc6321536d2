"""``oar credits``: the registered token-credit methods as a table (what each computes, costs, cites)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("credits", help="list the token-credit methods (the registry) as a Markdown table",
                              description="Every method OARConfig.credit, oar compare --credits and oar attribute "
                              "--credit accept; wrap any of them as shuffle:NAME or inverted:NAME for a control.")
    p.add_argument("--import", dest="modules", action="append", metavar="MODULE", default=[],
                   help="import this module first (it registers its own methods); repeatable")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import importlib

    import oar.lab  # noqa: F401  (registers the lab's oracle credits)
    from oar.credit import credit_table

    for module in args.modules:
        importlib.import_module(module)
    print(credit_table())
    return 0
