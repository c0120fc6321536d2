"""Token credit: one registry of methods and one function from a rollout batch to per-token advantages.

A *credit method* turns GRPO's sequence advantages ``A [B]`` into token advantages ``[B, T]``: a ``score``
(a per-token signal) and an ``effect`` (the signal -> weights, offsets or the token advantages themselves).
:func:`register_credit` adds one; :func:`token_credit` runs one on a :class:`CreditBatch` and returns a
:class:`TokenCredit`. Controls wrap any method: ``shuffle:NAME``, ``inverted:NAME``.

Modules, one concept each: :mod:`.batch` (what a method reads and returns), :mod:`.options` (how options reach
a method), :mod:`.registry`, :mod:`.controls`, :mod:`.run` (:func:`token_credit`), :mod:`.spec` (the
``NAME@OPT=VALUE`` column grammar), :mod:`.catalogue` (every built-in, registered in one fixed order) and
:mod:`.peers` (the peer methods' tensor functions). Pure torch; no framework imports.
"""

from oar.credit import catalogue as _catalogue  # noqa: F401  (registers the built-ins)
from oar.credit.batch import FLAG_KEYS, CreditBatch, TokenCredit
from oar.credit.controls import CONTROLS, reverse_ranks, shuffle_within_rows
from oar.credit.options import CONTEXT, call_with_options
from oar.credit.registry import (
    COMBINES,
    INVERTS,
    CreditMethod,
    bilevel_effect,
    credit_names,
    credit_table,
    get_credit,
    import_modules,
    register_credit,
    unregister_credit,
)
from oar.credit.run import credit_effect, token_credit
from oar.credit.spec import credit_column

__all__ = [
    "COMBINES", "CONTEXT", "CONTROLS", "FLAG_KEYS", "INVERTS", "CreditBatch", "CreditMethod", "TokenCredit",
    "bilevel_effect", "call_with_options", "credit_column", "credit_effect", "credit_names", "credit_table",
    "get_credit", "import_modules", "register_credit", "reverse_ranks", "shuffle_within_rows", "token_credit",
    "unregister_credit",
]
