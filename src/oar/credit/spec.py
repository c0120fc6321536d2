"""One credit value, from the command line to ``run.json``: :class:`CreditSpec`, a method and its options written
as ``NAME`` or ``NAME@OPT=VALUE&OPT=VALUE`` (``oar-p@horizon=2&chunk_size=64``, ``shuffle:oar-g@beta=2``).

``OARConfig.credit``, ``oar train --credit``, ``oar attribute --credit``, the verl ``oar.credit`` key, the lab's
``RunConfig.credit`` and ``oar compare --credits`` all take this form. :meth:`CreditSpec.parse` reads it,
:meth:`CreditSpec.format` (``str(spec)``) writes it back (the comparison column, the run directory name and the
``credit`` of ``run.json``), :meth:`CreditSpec.resolve` looks the method up and checks the options, once.

The grammar is pure Python (no torch), so reading a run directory needs none; :meth:`CreditSpec.resolve` imports
the registry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from oar.credit.registry import CreditMethod


class ResolvedCredit(NamedTuple):
    """A credit looked up and checked: the registered method and every option it takes (defaults filled in)."""

    method: CreditMethod
    options: dict[str, Any]


@dataclass(frozen=True, eq=False, init=False)
class CreditSpec:
    """A credit method (or a control ``shuffle:NAME`` / ``inverted:NAME``) and the options given for it.

    ``name``: lower case, as registered. ``options``: a read-only mapping in the order written (values are JSON
    types: ``horizon=2`` is the int 2, ``mode=last`` the text ``"last"``). Two specs are equal when they print the
    same. ``str(spec)`` is the canonical text, and ``CreditSpec.parse(str(spec)) == spec`` for every spec.
    """

    name: str
    options: Mapping[str, Any]

    def __init__(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(name, str) or not name.strip() or "@" in name:
            raise ValueError(f"a credit name is a non-empty string without '@', got {name!r}")
        if options is not None and not isinstance(options, Mapping):
            raise ValueError(f"credit options must be a mapping of option name to value, got {options!r}")
        for key in options or {}:
            if not isinstance(key, str) or not key.strip() or any(c in key for c in "&=@"):
                raise ValueError(f"credit option names are non-empty text without '&', '=' or '@', got {key!r}")
        object.__setattr__(self, "name", name.strip().lower())
        object.__setattr__(self, "options", MappingProxyType({k.strip(): v for k, v in (options or {}).items()}))

    @classmethod
    def parse(cls, text: str | CreditSpec) -> CreditSpec:
        """``NAME`` or ``NAME@OPT=VALUE&OPT=VALUE``: each value parsed as JSON (``2``, ``0.5``, ``null``, ``true``,
        ``[1, 2]``, ``"2"`` for the text 2), else kept as text (``mode=last``). ValueError naming a malformed part
        or an option given twice; whether the credit and its options exist is :meth:`resolve`'s to say."""
        if isinstance(text, CreditSpec):
            return text
        if not isinstance(text, str):
            raise ValueError(f"a credit is a string NAME or NAME@OPT=VALUE&..., got {text!r}")
        name, at, rest = text.strip().partition("@")
        if not name.strip():
            raise ValueError(f"credit {text!r}: expected NAME or NAME@OPT=VALUE&OPT=VALUE")
        options: dict[str, Any] = {}
        for pair in filter(str.strip, rest.split("&")) if at else ():
            key, eq, value = pair.partition("=")
            key = key.strip()
            if not eq or not key:
                raise ValueError(f"credit {text!r}: expected OPT=VALUE after '@', got {pair!r}")
            if key in options:
                raise ValueError(f"credit {text!r}: option {key!r} is given twice")
            options[key] = _value(value)
        return cls(name, options)

    def format(self) -> str:
        """The canonical text, the inverse of :meth:`parse`: ``CreditSpec("oar-p", {"horizon": 2}).format() ==
        "oar-p@horizon=2"`` (options in the order given; text bare unless it would read back as something else,
        then as a JSON string; other values as compact JSON)."""
        if not self.options:
            return self.name
        return self.name + "@" + "&".join(f"{k}={_text(v)}" for k, v in self.options.items())

    __str__ = format

    def __repr__(self) -> str:
        return f"CreditSpec({self.format()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CreditSpec) and self.format() == other.format()

    def __hash__(self) -> int:
        return hash(self.format())

    def __reduce__(self) -> tuple[Any, ...]:
        return CreditSpec, (self.name, dict(self.options))

    def merged(self, options: Mapping[str, Any], source: str) -> CreditSpec:
        """This spec with ``options`` added (``source`` names where they come from, for the error); ValueError
        for an option given here and there with different values (each option is set one way)."""
        clash = sorted(k for k in options if k in self.options and self.options[k] != options[k])
        if clash:
            k = clash[0]
            raise ValueError(f"credit {self.format()!r} sets {k}={_text(self.options[k])}, and {source} sets "
                             f"{k}={_text(options[k])}: set each option once (in the credit, as NAME@{k}=VALUE)")
        return CreditSpec(self.name, {**self.options, **options})

    def resolve(self) -> ResolvedCredit:
        """The registered method (a control wraps its base) and its checked options, defaults filled in;
        ValueError naming an unknown credit, an undeclared option, a value its declaration refuses (NaN and ±inf
        included) or a combination the method's rules refuse (``oar-g@noise_std=0&mode=last``)."""
        from oar.credit.registry import get_credit

        method = get_credit(self.name)
        return ResolvedCredit(method, method.check_options(dict(self.options)))


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text.strip()


def _text(value: Any) -> str:
    if isinstance(value, str) and value and "&" not in value and _value(value) == value:
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).replace("&", "\\u0026")
