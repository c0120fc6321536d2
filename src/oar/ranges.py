"""A number's valid range, written once as text and checked from it: ``">= 0"``, ``"> 0"``, ``"in (0, 1)"``,
``"in [0, 1]"``, ``"in (0, 1]"``. The text is what an error shows: ``oar_tau must be in (0, 1), got 1.5``.
And :func:`check_finite_fields`: no field of a config dataclass holds NaN or an infinity.
Pure Python; no imports beyond the standard library."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

_BOUND = re.compile(r"^(>=|>|<=|<)\s*(\S+)$")
_INTERVAL = re.compile(r"^in\s*([(\[])\s*(\S+)\s*,\s*(\S+)\s*([)\]])$")


def in_range(value: float, rule: str) -> bool:
    """Whether ``value`` (a finite real number, not a bool) meets ``rule``; ValueError for a malformed rule."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    if m := _BOUND.match(rule.strip()):
        op, bound = m.group(1), float(m.group(2))
        return {">=": value >= bound, ">": value > bound, "<=": value <= bound, "<": value < bound}[op]
    if m := _INTERVAL.match(rule.strip()):
        left, lo, hi, right = m.group(1), float(m.group(2)), float(m.group(3)), m.group(4)
        return (value >= lo if left == "[" else value > lo) and (value <= hi if right == "]" else value < hi)
    raise ValueError(f"malformed range {rule!r}: expected '>= X', '> X', '<= X', '< X' or 'in (A, B)' / '[A, B]'")


def check_range(label: str, value: float, rule: str) -> None:
    """ValueError ``LABEL must be RULE, got VALUE`` unless ``value`` meets ``rule``."""
    if not in_range(value, rule):
        raise ValueError(f"{label} must be {rule}, got {value!r}")


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    return isinstance(value, list | tuple) and any(isinstance(v, float) and not math.isfinite(v) for v in value)


def check_finite_fields(config: Any, prefix: str = "") -> None:
    """ValueError ``NAME must be a finite number, got inf`` (``... finite numbers, got [1.0, nan]``) for the first
    field of the dataclass ``config`` holding a non-finite float (NaN, +-inf), alone or in a list or tuple; nested
    dataclasses are checked too (``warm.lr``). Every float field, whoever declared it (TRL, transformers, oar), so
    a new field is covered without a list to keep. Dicts (other libraries' keyword arguments, credit options) are
    checked where their keys are declared."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name, None)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_finite_fields(value, f"{prefix}{f.name}.")
        elif _non_finite(value):
            what = "finite numbers" if isinstance(value, list | tuple) else "a finite number"
            raise ValueError(f"{prefix}{f.name} must be {what}, got {value!r}")
