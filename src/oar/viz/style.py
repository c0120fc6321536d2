"""What the HTML and terminal views share: grouping records, the colour of a token, summaries."""

from __future__ import annotations

import math
from collections.abc import Sequence

from oar.attribution import AttributionRecord, record_correlation

WHITE = (255, 255, 255)
COOL = (44, 123, 182)  # suppressed reasoning tokens (w < 1)
WARM = (215, 48, 39)  # boosted reasoning tokens (w > 1)
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


def weight_scale(records: Sequence[AttributionRecord]) -> float:
    """Largest ``|log w|`` over all reasoning tokens: the weight drawn at full colour (one scale a page)."""
    logs = [abs(math.log(w)) for r in records for w, m in zip(r.weights, r.reasoning, strict=True)
            if m and w > 0 and math.isfinite(w)]
    return max(logs, default=0.0)


def _blend(colour: tuple[int, int, int], t: float) -> tuple[int, int, int]:
    return tuple(round(w + (c - w) * t) for w, c in zip(WHITE, colour, strict=True))


def token_rgb(weight: float, reasoning: bool, answer: bool, scale: float) -> tuple[int, int, int]:
    """Background of a token: cool below weight 1, warm above (intensity ``|log w| / scale``), white at 1;
    answer-statement and other non-reasoning tokens get fixed neutral colours."""
    if answer:
        return ANSWER
    if not reasoning:
        return NEUTRAL
    if not (weight > 0 and math.isfinite(weight)) or scale <= 0:
        return WHITE
    v = max(-1.0, min(1.0, math.log(weight) / scale))
    return _blend(COOL if v < 0 else WARM, abs(v))


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
    """Spearman correlation of every pair of credits in a group, over shared reasoning tokens."""
    return [(a.credit, b.credit, record_correlation(a, b))
            for i, a in enumerate(group) for b in group[i + 1 :]]


def tooltip(record: AttributionRecord, i: int) -> str:
    """Hover text of token ``i``: the token, its raw score and its weight, and its role."""
    role = "answer" if record.answer[i] else "reasoning" if record.reasoning[i] else "other"
    return f"{record.tokens[i]!r} · score {record.scores[i]:.4g} · weight {record.weights[i]:.3f} · {role}"
