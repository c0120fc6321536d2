"""The ``--config FILE.yaml`` of ``oar train``, checked before TRL's parser reads it: bad YAML names the file
and line, a value of the wrong type names the field."""

from __future__ import annotations

import enum
import types
import typing
from pathlib import Path
from typing import Any


def check_config_file(path: str, dataclasses: tuple[type, ...]) -> dict[str, Any]:
    """The ``--config`` YAML mapping, with a ValueError naming the file and line for bad YAML and naming the
    field for a value of the wrong type (``max_steps: 2.5``, a list for a float)."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"cannot read --config {path!r}: {err.strerror or err}") from err
    try:
        mapping = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise ValueError(f"{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from err
    if not isinstance(mapping, dict):
        raise ValueError(f"--config {path!r} must hold a YAML mapping of field: value, got {type(mapping).__name__}")
    hints: dict[str, Any] = {}
    for cls in dataclasses:
        hints.update(typing.get_type_hints(cls))
    for key, value in mapping.items():
        if key in hints and not _fits(value, hints[key]):
            raise ValueError(f"{path}: {key}: {value!r} is not a valid {_type_name(hints[key])}")
    return mapping


_SIMPLE = {int: (int,), float: (int, float), str: (str,), bool: (bool,), list: (list,), dict: (dict,)}


def _fits(value: Any, hint: Any) -> bool:
    """Whether a YAML value can be a field of type ``hint`` (unknown or complex types always fit)."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for member in members:
        if member is type(None):
            if value is None:
                return True
            continue
        base = typing.get_origin(member) or member
        if base not in _SIMPLE or isinstance(base, type) and issubclass(base, enum.Enum):
            return True  # Literal, enums, callables, ...: left to the dataclass
        if isinstance(value, _SIMPLE[base]) and not (isinstance(value, bool) and base is not bool):
            return True
        if isinstance(value, str) and base in (int, float, bool) and _parses(value, base):
            return True  # argparse converts string defaults: YAML reads 1e-3 as text
    return False


def _parses(text: str, base: type) -> bool:
    if base is bool:
        return text.lower() in ("true", "false", "yes", "no", "1", "0", "y", "n", "t", "f")
    try:
        base(text)
    except ValueError:
        return False
    return True


def _type_name(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")
