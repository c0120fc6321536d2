"""``oar credits``: the registered token-credit methods as a table (what each computes, costs, cites)."""

from __future__ import annotations

import argparse

from oar.cli.parser import add_import_option


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("credits", help="list the token-credit methods (the registry) as a Markdown table",
                              description="Every method OARConfig.credit, oar train --credit, oar compare --credits "
                              "and oar attribute --credit accept, each with its options as NAME@OPT=VALUE&OPT=VALUE; "
                              "wrap any of them as shuffle:NAME or inverted:NAME for a control.")
    add_import_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import oar.lab  # noqa: F401  (registers the lab's oracle credits, after every built-in)
    from oar.credit import credit_table, import_modules

    import_modules(args.modules)
    print(credit_table())
    return 0
