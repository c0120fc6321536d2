"""Reasoning steps: where a step ends, and which step every token belongs to. The one home of the step boundaries
that ``oar-prefix`` scores across and the ``step`` / ``process`` reshaping rules (:mod:`oar.reshape`) group by.

A step ends at a token whose decoded text matches a separator regex (the lab's ``;``, a newline for real math); the
step-ending token ids come from a tokenizer (:func:`separator_ids`) or are given. Pure torch; the tokenizer is only
read (``get_vocab``, ``decode``).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import torch

SEPARATOR = r"\n|;"  # a reasoning token whose text matches ends a step (newlines, the lab's "; ")


@lru_cache(maxsize=16)
def _vocab_matches(tokenizer, pattern: str) -> tuple[int, ...]:
    rx = re.compile(pattern)
    vocab = tokenizer.get_vocab()
    return tuple(sorted(i for i in vocab.values() if rx.search(tokenizer.decode([i]))))


def separator_ids(tokenizer, separator: str = SEPARATOR) -> tuple[int, ...]:
    """The ids of every vocabulary token whose decoded text matches the regex ``separator`` (cached per tokenizer
    and pattern); ValueError when none does."""
    try:
        re.compile(separator)
    except re.error as err:
        raise ValueError(f"separator {separator!r} is not a regular expression: {err}") from None
    ids = _vocab_matches(tokenizer, separator)
    if not ids:
        raise ValueError(f"no token of the tokenizer matches separator {separator!r}")
    return ids


def step_ends(separator: str = SEPARATOR, boundary_ids: list[int] | tuple[int, ...] | None = None,
              tokenizer: Any = None, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[n]`` long: the step-ending token ids, ``boundary_ids`` when given, else those of ``tokenizer`` matching
    ``separator``. ValueError when neither is there (one line, naming both ways)."""
    if boundary_ids is None:
        if tokenizer is None:
            raise ValueError("the step boundaries need boundary_ids (the step-ending token ids) or a tokenizer to "
                             f"resolve separator={separator!r} (CreditBatch.tokenizer, or the outcome probe's)")
        boundary_ids = separator_ids(tokenizer, separator)
    return torch.tensor(list(boundary_ids), dtype=torch.long, device=device)


def step_ids(input_ids: torch.Tensor, mask: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` long: the step of every masked token (0, 1, ... in position order; a step ends at a masked token
    whose id is in ``ends`` [n], which belongs to the step it ends), -1 elsewhere."""
    is_end = mask & torch.isin(input_ids, ends)
    before = is_end.long().cumsum(dim=1) - is_end.long()  # step ends strictly before each position
    return torch.where(mask, before, -1)
