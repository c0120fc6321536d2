"""``oar credits``: the registered token-credit methods as a table (what each computes, costs, cites)."""

from __future__ import annotations

import argparse

from oar.cli.parser import add_import_option


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("credits", help="list the token-credit methods (the registry) and the reshaping "
                              "rules as Markdown tables",
                              description="Every method OARConfig.credit, oar train --credit, oar compare --credits "
                              "and oar attribute --credit accept, each with its options as NAME@OPT=VALUE&OPT=VALUE; "
                              "wrap any of them as shuffle:NAME or inverted:NAME for a control. Then the reshaping "
                              "rules every importance credit takes as rule=NAME (oar-g@rule=sign).")
    add_import_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import oar.lab  # noqa: F401  (registers the lab's oracle credits, after every built-in)
    from oar.cli.parser import import_user_modules
    from oar.credit import credit_table, rule_table

    import_user_modules("oar credits", args.modules)
    print(credit_table())
    print("Reshaping rules (the rule option of every importance credit):\n")
    print(rule_table())
    return 0
