"""How a credit method's options and context reach its ``score`` and ``effect``: by the names in their
signatures."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

CONTEXT = ("generator", "active", "batch_size", "batch")  # passed by token_credit to a score/effect that takes them


def parameter_names(fn: Callable[..., Any]) -> set[str]:
    return {n for n, p in inspect.signature(fn).parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def call_with_options(fn: Callable[..., Any], *args: Any, options: Mapping[str, Any], **context: Any) -> Any:
    """``fn(*args, **options it takes)``, plus the ``context`` entries (``generator``, ``active``,
    ``batch_size``, ``batch``) its signature names and the options do not set (how :func:`oar.credit.token_credit`
    calls a method's score and effect)."""
    names = parameter_names(fn)
    kw = {k: v for k, v in options.items() if k in names}
    kw.update({k: v for k, v in context.items() if k in names and k not in kw})
    return fn(*args, **kw)
