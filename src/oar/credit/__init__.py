"""Token credit: one registry of methods and one function from a rollout batch to per-token advantages.

A *credit method* turns GRPO's sequence advantages ``A [B]`` into token advantages ``[B, T]``: a ``score``
(a per-token signal) and an ``effect`` (the signal -> weights, offsets or the token advantages themselves).
:func:`register_credit` adds one; :func:`token_credit` runs one on a :class:`CreditBatch` and returns a
:class:`TokenCredit`. Controls wrap any method: ``shuffle:NAME``, ``inverted:NAME``. A credit and its options
travel as one value, :class:`CreditSpec` (``oar-p@horizon=2``), parsed, printed and resolved once.

Modules, one concept each: :mod:`.batch` (what a method reads and returns), :mod:`.options` (how options are
declared, grouped and reach a method), :mod:`.spec` (:class:`CreditSpec`), :mod:`.registry`, :mod:`.controls`,
:mod:`.run` (:func:`token_credit`), :mod:`.metrics` (the logged schema), :mod:`.catalogue` (every built-in,
registered in one fixed order, on the registry's first use) and :mod:`.peers` (the peer methods' tensor
functions). Pure torch, no framework imports; :mod:`.spec` and :mod:`.options` are pure Python, and the names
below load on first use, so ``from oar.credit import CreditSpec`` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "CreditBatch": "oar.credit.batch", "TokenCredit": "oar.credit.batch", "FLAG_KEYS": "oar.credit.batch",
    "CONTEXT": "oar.credit.options", "Option": "oar.credit.options", "OptionGroup": "oar.credit.options",
    "call_with_options": "oar.credit.options",
    "CreditSpec": "oar.credit.spec", "ResolvedCredit": "oar.credit.spec",
    "CONTROLS": "oar.credit.controls", "reverse_ranks": "oar.credit.controls",
    "shuffle_within_rows": "oar.credit.controls",
    "COMBINES": "oar.credit.registry", "INVERTS": "oar.credit.registry", "CreditMethod": "oar.credit.registry",
    "bilevel_effect": "oar.credit.registry", "credit_names": "oar.credit.registry",
    "credit_table": "oar.credit.registry", "get_credit": "oar.credit.registry", "rule_table": "oar.credit.registry",
    "import_modules": "oar.credit.registry", "register_credit": "oar.credit.registry",
    "unregister_credit": "oar.credit.registry",
    "credit_effect": "oar.credit.run", "token_credit": "oar.credit.run",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'oar.credit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cached: the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
