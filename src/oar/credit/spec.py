"""The credit-column grammar ``NAME`` or ``NAME@OPT=VALUE&OPT=VALUE`` (``oar compare --credits``, the GPU
check): a credit method and its options in one string."""

from __future__ import annotations

import json

from oar.credit.registry import get_credit


def credit_column(spec: str) -> tuple[str, dict]:
    """A comparison column ``NAME`` or ``NAME@OPT=VALUE&OPT=VALUE`` (e.g. ``oar-g@beta=2``): the credit and its
    options (values parsed as JSON, else kept as text). ValueError naming an unknown credit or option."""
    if "/" in spec or "\\" in spec or ".." in spec:  # the column names its run directories
        raise ValueError(f"credit column {spec!r} must not contain '/', '\\' or '..'")
    name, _, opts = spec.strip().partition("@")
    options = {}
    for pair in filter(None, opts.split("&")):
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"credit column {spec!r}: expected OPT=VALUE after '@', got {pair!r}")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value.strip()
    get_credit(name).check_options(options)  # ValueError naming an unknown credit or option
    return name.strip().lower(), options


def column_name(name: str, options: dict | None = None) -> str:
    """The column string of a credit and its options, the inverse of :func:`credit_column`:
    ``column_name("oar-p", {"horizon": 2}) == "oar-p@horizon=2"`` (options in key order; values as JSON, text bare)."""
    if not options:
        return name
    pairs = (f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in sorted(options.items()))
    return name + "@" + "&".join(pairs)
