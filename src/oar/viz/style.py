"""What the HTML and terminal views share: grouping records, the colour of a token, summaries."""

from __future__ import annotations

import math
from collections.abc import Sequence

from oar.attribution import AttributionRecord, record_correlation

WHITE = (255, 255, 255)
COOL = (86, 150, 197)  # most suppressed reasoning token (light enough for black text)
WARM = (223, 89, 82)  # most boosted reasoning token
NEUTRAL = (236, 236, 236)  # neither reasoning nor answer (e.g. a completion with no answer)
ANSWER = (226, 214, 250)  # the final-answer statement


def group_records(records: Sequence[AttributionRecord]) -> list[list[AttributionRecord]]:
    """Group records of the same completion (same step, prompt and text) so their credits sit side by side.

    Groups keep the order of first appearance; a credit repeated within a group starts a new group.
    """
    groups: list[list[AttributionRecord]] = []
    open_groups: dict[tuple, list[AttributionRecord]] = {}
    for r in records:
        key = (r.step, r.prompt, tuple(r.tokens))
        group = open_groups.get(key)
        if group is None or any(g.credit == r.credit for g in group):
            group = []
            groups.append(group)
            open_groups[key] = group
        group.append(r)
    return groups


def weight_range(records: Sequence[AttributionRecord]) -> tuple[float, float]:
    """``(lowest, highest)`` reasoning-token weight over ``records`` (each side clipped to 1): the weights
    drawn at full colour. One range a page, so credits side by side share it."""
    ws = [w for r in records for w, m in zip(r.weights, r.reasoning, strict=True) if m and 0 < w < math.inf]
    return min(ws + [1.0]), max(ws + [1.0])


def _blend(colour: tuple[int, int, int], t: float) -> tuple[int, int, int]:
    return tuple(round(w + (c - w) * t) for w, c in zip(WHITE, colour, strict=True))


def token_rgb(weight: float, reasoning: bool, answer: bool, scale: tuple[float, float]) -> tuple[int, int, int]:
    """Background of a token: white at weight 1, cool below (full at ``scale[0]``), warm above (full at
    ``scale[1]``), by ``log w``; answer-statement and other non-reasoning tokens get fixed neutral colours."""
    if answer:
        return ANSWER
    if not reasoning:
        return NEUTRAL
    lo, hi = scale
    if not 0 < weight < math.inf or weight == 1:
        return WHITE
    if weight < 1:
        return _blend(COOL, min(1.0, math.log(weight) / math.log(lo))) if lo < 1 else WHITE
    return _blend(WARM, min(1.0, math.log(weight) / math.log(hi))) if hi > 1 else WHITE


def describe(record: AttributionRecord) -> str:
    """One line: credit, step, reward, advantage, reasoning token count, weight range and ESS ratio."""
    w = [x for x, m in zip(record.weights, record.reasoning, strict=True) if m]
    parts = [record.credit]
    for name in ("step", "reward", "advantage"):
        value = getattr(record, name)
        if value is not None:
            parts.append(f"{name} {value:g}" if isinstance(value, (int, float)) else f"{name} {value}")
    parts.append(f"{len(w)} reasoning tokens")
    if w:
        ess = sum(w) ** 2 / (len(w) * sum(x * x for x in w)) if any(w) else 0.0
        parts.append(f"w {min(w):.2f}..{max(w):.2f}, ESS {ess:.2f}")
    return " · ".join(parts)


def correlations(group: Sequence[AttributionRecord]) -> list[tuple[str, str, float]]:
    """Spearman correlation of the credit every pair of methods in a group applies, over shared reasoning tokens
    (:func:`oar.attribution.record_correlation`)."""
    return [(a.credit, b.credit, record_correlation(a, b))
            for i, a in enumerate(group) for b in group[i + 1 :]]


def tooltip(record: AttributionRecord, i: int) -> str:
    """Hover text of token ``i``: the token, its raw score and its weight, and its role."""
    role = "answer" if record.answer[i] else "reasoning" if record.reasoning[i] else "other"
    return f"{record.tokens[i]!r} · score {record.scores[i]:.4g} · weight {record.weights[i]:.3f} · {role}"
