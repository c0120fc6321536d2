"""Controls that wrap any registered method: ``shuffle:NAME`` permutes the method's per-token effect within
each completion (same distribution, no information about *where*), ``inverted:NAME`` computes it from reversed
score ranks (boosts what the method would suppress). Pure torch."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from oar.credit.options import call_with_options as _call

CONTROLS = ("shuffle", "inverted")


def shuffle_within_rows(values: torch.Tensor, mask: torch.Tensor,
                        generator: torch.Generator | None = None) -> torch.Tensor:
    """``values [B, T]`` with the masked entries of each row randomly permuted among themselves (the rest
    unchanged): the same per-row multiset, no information about position."""
    B, T = values.shape
    gen_device = generator.device if generator is not None else values.device
    keys = torch.rand(B, T, generator=generator, device=gen_device).to(values.device)
    source = torch.argsort(keys.masked_fill(~mask, float("inf")), dim=1, stable=True)  # masked, random order
    target = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # masked, positional order
    out = values.clone()
    out.scatter_(1, target, values.gather(1, source))
    return out


def reverse_ranks(scores: torch.Tensor, mask: torch.Tensor, scope: str) -> torch.Tensor:
    """Scores whose order is reversed over the masked entries: ``max + min - s`` within each row (``"row"``)
    or over the whole batch (``"batch"``), ``-s`` for ``"negate"``. Unmasked entries keep their value."""
    if scope == "negate":
        return torch.where(mask, -scores, scores)
    dims = {"dim": 1, "keepdim": True} if scope == "row" else {}
    hi = scores.masked_fill(~mask, float("-inf")).amax(**dims)
    lo = scores.masked_fill(~mask, float("inf")).amin(**dims)
    return torch.where(mask, hi + lo - scores, scores)


def shuffled_effect(effect: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def shuffled(scores: torch.Tensor, mask: torch.Tensor, generator: torch.Generator | None = None,
                 **options: Any) -> torch.Tensor:
        return shuffle_within_rows(_call(effect, scores, mask, options=options, generator=generator), mask,
                                   generator)

    shuffled.__signature__ = _merged_signature(effect)  # type: ignore[attr-defined]
    return shuffled


def inverted_effect(effect: Callable[..., torch.Tensor], scope: str) -> Callable[..., torch.Tensor]:
    def inverted(scores: torch.Tensor, mask: torch.Tensor, generator: torch.Generator | None = None,
                 **options: Any) -> torch.Tensor:
        return _call(effect, reverse_ranks(scores, mask, scope), mask, options=options, generator=generator)

    inverted.__signature__ = _merged_signature(effect)  # type: ignore[attr-defined]
    return inverted


def _merged_signature(effect: Callable[..., Any]) -> inspect.Signature:
    """The wrapped effect's parameters plus ``generator`` (so options route to the wrapper as to the effect)."""
    params = list(inspect.signature(effect).parameters.values())
    if "generator" not in {p.name for p in params}:
        params.append(inspect.Parameter("generator", inspect.Parameter.KEYWORD_ONLY, default=None))
    return inspect.Signature(params)
