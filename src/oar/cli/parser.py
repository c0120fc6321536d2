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
    the credit methods they register are known (:func:`import_user_modules`)."""
    parser.add_argument("--import", dest="modules", action="append", metavar="MODULE", default=[],
                        help="import this module first (it registers its own credit methods); repeatable")


def module_name(value: str) -> str:
    """``value`` if it is an absolute, dotted module name (``mypkg.credits``); else ValueError naming it: a
    relative name (``.credits``) or a file path cannot be imported by name."""
    if not all(part.isidentifier() for part in value.split(".")):
        raise ValueError(f"--import needs a module name such as mypkg.credits (no relative name or file path), "
                         f"got {value!r}")
    return value


def import_user_modules(prog: str, modules: list[str]) -> None:
    """Import the ``--import`` modules, in order (what :func:`oar.credit.import_modules` does for the Python API).

    A module that does not exist: ValueError naming it (the one ``PROG: error:`` line). A module whose own code
    raises (a missing dependency included): ``PROG: error: --import 'M' failed ...`` on stderr, then its traceback,
    which says where in the user's code, and exit status 1."""
    import importlib
    import sys
    import traceback

    for module in modules:
        module_name(module)
        try:
            importlib.import_module(module)
        except Exception as err:
            missing = getattr(err, "name", None) if isinstance(err, ModuleNotFoundError) else None
            if missing is not None and f"{module}.".startswith(f"{missing}."):  # the module or a parent package
                raise ValueError(f"--import {module!r}: no module named {missing!r}; is it on PYTHONPATH?") from None
            print(f"{prog}: error: --import {module!r} failed: importing it raised {type(err).__name__} "
                  "(its traceback follows)", file=sys.stderr)
            traceback.print_exc()
            raise SystemExit(1) from None


__all__ = ["OneLineParser", "add_import_option", "import_user_modules", "module_name", "one_line_error",
           "one_line_errors"]
