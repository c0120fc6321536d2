"""A credit method's options: each declared once (:class:`Option`: default, type, range or choices; every number
finite), grouped where several methods share them (:class:`OptionGroup`, with the group's own cross-option check),
checked when a config or a comparison column is built, and routed to the method's ``score`` and ``effect`` by the
names in their signatures (with the context :func:`oar.credit.token_credit` passes). Pure Python."""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from oar.ranges import check_range

_KIND_NAMES = {float: "a number", int: "an integer", str: "a string", bool: "true or false"}

# a cross-option check: called with every option of a method (defaults filled in); ValueError names the conflict
OptionCheck = Callable[[Mapping[str, Any]], None]


@dataclass(frozen=True)
class Option:
    """One option of a credit method, declared once.

    ``default``: its value when not given. ``kind``: ``float`` (an int is accepted), ``int``, ``str``, ``bool``,
    or None (any value: what a plain default in ``register_credit(options={"k": 3})`` declares). ``range``: a
    rule of :mod:`oar.ranges` (``">= 1"``, ``"in (0, 1]"``) for numbers; ``choices``: the allowed values.
    ``None`` is accepted when ``nullable`` (always when the default is None). ``regex``: a string that must
    compile as a regular expression. A number (any kind) must be finite: NaN and ±inf are refused.
    """

    default: Any
    kind: type | None = None
    range: str | None = None
    choices: tuple = ()
    nullable: bool = False
    regex: bool = False

    def check(self, label: str, value: Any) -> None:
        """ValueError ``LABEL must be ..., got VALUE`` for a value of the wrong type, not finite, out of range or
        not a choice."""
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
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{label} must be a finite number, got {value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"{label} must be one of {', '.join(map(repr, self.choices))}, got {value!r}")
        if self.range is not None:
            check_range(label, value, self.range)
        if self.regex:
            try:
                re.compile(value)
            except (re.error, TypeError) as err:
                raise ValueError(f"{label} must be a regular expression, got {value!r} ({err})") from None


def as_option(spec: Any) -> Option:
    """An :class:`Option` as declared, or a plain default (any value accepted)."""
    return spec if isinstance(spec, Option) else Option(spec)


@dataclass(frozen=True)
class OptionGroup(Mapping[str, Option]):
    """Options several methods share, declared once with the group's own cross-option ``check``: a method takes
    the group whole (``register_credit(..., groups=(BILEVEL,))``), so an option added here reaches every method
    that lists the group (its score or effect must take it). Reads as a mapping name -> :class:`Option`."""

    name: str
    options: Mapping[str, Option]
    check: OptionCheck | None = field(default=None, compare=False)

    def __getitem__(self, key: str) -> Option:
        return self.options[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.options)

    def __len__(self) -> int:
        return len(self.options)

    def with_defaults(self, **defaults: Any) -> OptionGroup:
        """The same group (options, check) with other defaults for the options named (e.g. the lab's
        ``oracle-process``: the reshaping group with ``rule="process"``); ValueError naming an option it lacks."""
        unknown = sorted(set(defaults) - set(self.options))
        if unknown:
            raise ValueError(f"option group {self.name!r} has no option(s) {unknown}")
        return OptionGroup(self.name, {k: replace(o, default=defaults[k]) if k in defaults else o
                                       for k, o in self.options.items()}, self.check)


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
