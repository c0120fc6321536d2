"""A number's valid range, written once as text and checked from it: ``">= 0"``, ``"> 0"``, ``"in (0, 1)"``,
``"in [0, 1]"``, ``"in (0, 1]"``. The text is what an error shows: ``oar_tau must be in (0, 1), got 1.5``.
Pure Python; no imports beyond the standard library."""

from __future__ import annotations

import math
import re

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
