"""A credit method's options: each declared once (:class:`Option`: default, type, range or choices), checked
when a config or a comparison column is built, and routed to the method's ``score`` and ``effect`` by the names
in their signatures (with the context :func:`oar.credit.token_credit` passes)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from oar.ranges import check_range

_KIND_NAMES = {float: "a number", int: "an integer", str: "a string", bool: "true or false"}


@dataclass(frozen=True)
class Option:
    """One option of a credit method, declared once.

    ``default``: its value when not given. ``kind``: ``float`` (an int is accepted), ``int``, ``str``, ``bool``,
    or None (any value: what a plain default in ``register_credit(options={"k": 3})`` declares). ``range``: a
    rule of :mod:`oar.ranges` (``">= 1"``, ``"in (0, 1]"``) for numbers; ``choices``: the allowed values.
    ``None`` is accepted when ``nullable`` (always when the default is None).
    """

    default: Any
    kind: type | None = None
    range: str | None = None
    choices: tuple = ()
    nullable: bool = False

    def check(self, label: str, value: Any) -> None:
        """ValueError ``LABEL must be ..., got VALUE`` for a value of the wrong type, out of range or not a choice."""
        if value is None and (self.nullable or self.default is None):
            return
        kind = self.kind
        if kind is not None:
            ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
            if kind is float:
                ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not ok:
                none = " or null" if self.nullable or self.default is None else ""
                raise ValueError(f"{label} must be {_KIND_NAMES.get(kind, kind.__name__)}{none}, got {value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"{label} must be one of {', '.join(map(repr, self.choices))}, got {value!r}")
        if self.range is not None:
            check_range(label, value, self.range)


def as_option(spec: Any) -> Option:
    """An :class:`Option` as declared, or a plain default (any value accepted)."""
    return spec if isinstance(spec, Option) else Option(spec)

# passed by token_credit to a score/effect whose signature names them
CONTEXT = ("generator", "active", "batch_size", "batch", "probe")


def parameter_names(fn: Callable[..., Any]) -> set[str]:
    return {n for n, p in inspect.signature(fn).parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def call_with_options(fn: Callable[..., Any], *args: Any, options: Mapping[str, Any], **context: Any) -> Any:
    """``fn(*args, **options it takes)``, plus the :data:`CONTEXT` entries its signature names and the options do
    not set (how :func:`oar.credit.token_credit` calls a method's score and effect)."""
    names = parameter_names(fn)
    kw = {k: v for k, v in options.items() if k in names}
    kw.update({k: v for k, v in context.items() if k in names and k not in kw})
    return fn(*args, **kw)
