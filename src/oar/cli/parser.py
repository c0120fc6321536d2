"""Argument errors as one line: ``oar eval: error: argument --samples: invalid int value: '2.5'``.

argparse prints its whole usage block before the error (for ``oar train``, TRL's, about 200 lines); ``oar``
prints only the line naming the bad value and exits with argparse's status 2. ``--help`` is unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import NoReturn


def one_line_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """``PROG: error: MESSAGE (see PROG --help)`` on stderr, one line; exit status 2."""
    message = " ".join(str(message).splitlines())
    parser.exit(2, f"{parser.prog}: error: {message} (see {parser.prog} --help)\n")


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (its subcommand parsers are of this class too)."""

    def error(self, message: str) -> NoReturn:
        one_line_error(self, message)


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Within the block every ``ArgumentParser`` (TRL's too, which ``oar`` does not construct itself) reports
    errors in one line."""
    saved = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = one_line_error  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = saved  # type: ignore[method-assign]


def add_import_option(parser: argparse.ArgumentParser) -> None:
    """``--import MODULE`` (repeatable, into ``args.modules``): modules imported before the command runs, so
    the credit methods they register are known (:func:`oar.credit.import_modules`)."""
    parser.add_argument("--import", dest="modules", action="append", metavar="MODULE", default=[],
                        help="import this module first (it registers its own credit methods); repeatable")


__all__ = ["OneLineParser", "add_import_option", "one_line_error", "one_line_errors"]
