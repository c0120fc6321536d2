"""The ``OARConfig`` field table of docs/training.md, generated from the dataclass (a test keeps the page equal).

Rows are the fields ``OARConfig`` adds to TRL's ``GRPOConfig``, whatever they are: name, default and the field's
``help`` metadata, grouped by the themes of the class docstring (a ``> Theme`` line, then the field names under
it); a field no theme names goes under "Other". ``python -m oar.config_table`` prints the table to paste.
"""

from __future__ import annotations

import dataclasses
import json
import re

OTHER = "Other"


def _default(f: dataclasses.Field) -> str:
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    elif f.default is dataclasses.MISSING:
        return "(required)"
    else:
        value = f.default
    return f"`{json.dumps(value)}`" if isinstance(value, str) else f"`{value!r}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def docstring_themes(cls: type) -> dict[str, list[str]]:
    """``{theme: [field names]}`` from ``cls``'s docstring: a ``> Theme`` line, then its field names on the next
    non-blank line (comma-separated), in order."""
    themes: dict[str, list[str]] = {}
    current = None
    for line in (cls.__doc__ or "").splitlines():
        line = line.strip()
        if line.startswith(">"):
            current = line.lstrip("> ").strip()
        elif current is not None and line:
            themes[current] = re.findall(r"[A-Za-z_]\w*", line)
            current = None
    return themes


def config_fields(cls: type | None = None, base: type | None = None) -> list[dataclasses.Field]:
    """The dataclass fields ``cls`` (default ``OARConfig``) adds to ``base`` (default TRL's ``GRPOConfig``)."""
    cls, base = _classes(cls, base)
    inherited = {f.name for f in dataclasses.fields(base)}
    return [f for f in dataclasses.fields(cls) if f.name not in inherited]


def config_table(cls: type | None = None, base: type | None = None) -> str:
    """The Markdown table: a bold row per theme, then one row per field (name, default, help)."""
    cls, base = _classes(cls, base)
    fields = {f.name: f for f in config_fields(cls, base)}
    groups = {theme: [fields[n] for n in names if n in fields] for theme, names in docstring_themes(cls).items()}
    themed = {f.name for group in groups.values() for f in group}
    groups[OTHER] = [f for name, f in fields.items() if name not in themed]
    lines = ["| field | default | meaning |", "|---|---|---|"]
    for theme, group in groups.items():
        if group:
            lines.append(f"| **{theme}** | | |")
            lines += [f"| `{f.name}` | {_default(f)} | {_cell(f.metadata.get('help', ''))} |" for f in group]
    return "\n".join(lines) + "\n"


def _classes(cls: type | None, base: type | None) -> tuple[type, type]:
    if cls is None:
        from oar.trainer import OARConfig

        cls = OARConfig
    if base is None:
        from trl import GRPOConfig

        base = GRPOConfig
    return cls, base


if __name__ == "__main__":
    print(config_table(), end="")
