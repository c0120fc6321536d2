"""Where ``oar attribute`` gets its records: a trainer dump, or texts scored with a model."""

from __future__ import annotations

import os
from collections.abc import Sequence

from oar.attribution import AttributionRecord, attribute_batch, is_record_file, read_pairs, read_records
from oar.credit.spec import CreditSpec
from oar.viz.style import group_records

DEFAULT_CREDIT = "oar-g"


def select_records(
    records: Sequence[AttributionRecord],
    credits: Sequence[str] | None = None,
    step: int | str | None = None,
    limit: int | None = None,
) -> list[AttributionRecord]:
    """Keep the records of some credits (all when None) at one training step (an int, ``"last"``, or all
    when None), then the first ``limit`` completions (each with all its credits)."""
    out = list(records)
    if credits:
        credits = [str(CreditSpec.parse(c)) for c in credits]  # as the records write it
        present = list(dict.fromkeys(r.credit for r in out))
        missing = [c for c in credits if c not in present]
        if missing:
            raise ValueError(f"credit {missing} not in the records (they have: {', '.join(present) or 'none'})")
        out = [r for r in out if r.credit in credits]
    if step is not None:
        steps = sorted({r.step for r in out if r.step is not None})
        if step == "last":
            if not steps:
                raise ValueError("step='last' but no record has a step")
            step = steps[-1]
        if step not in steps:
            raise ValueError(f"no record at step {step!r} (steps: {steps[:10]}{' ...' if len(steps) > 10 else ''})")
        out = [r for r in out if r.step == step]
    if limit is not None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        out = [r for g in group_records(out)[:limit] for r in g]
    return out


def compute_records(
    model_name: str,
    prompts: Sequence[str],
    completions: Sequence[str],
    credits: Sequence[str] = (DEFAULT_CREDIT,),
    rewards: Sequence[float] | None = None,
    **kwargs,
) -> list[AttributionRecord]:
    """Load ``model_name`` (see :func:`oar.models.load_model_and_tokenizer`) and score every completion
    under every credit method; ``kwargs`` go to :func:`oar.attribution.attribute_batch`. Completion-major order."""
    from oar.models import load_model_and_tokenizer

    for c in credits:  # fail on a bad credit or a missing input before loading the model
        if CreditSpec.parse(c).resolve().method.needs_group and rewards is None:
            raise ValueError(f"credit {c!r} reads the rollout group: give rows with a 'reward' field "
                             "(completions of one prompt form a group)")
    model, tokenizer = load_model_and_tokenizer(model_name)
    per_credit = [attribute_batch(model, tokenizer, prompts, completions, c, rewards=rewards, **kwargs)
                  for c in credits]
    return [rs[i] for i in range(len(prompts)) for rs in per_credit]


def collect_records(
    *,
    model: str | None = None,
    prompt: str | None = None,
    completion: str | None = None,
    from_jsonl: str | os.PathLike | None = None,
    credits: Sequence[str] | None = None,
    step: int | str | None = None,
    limit: int | None = None,
    **kwargs,
) -> list[AttributionRecord]:
    """Records for ``oar attribute``: read from a JSONL of records (no model needed), or computed with
    ``model`` for one (``prompt``, ``completion``) or a JSONL of ``{"prompt", "completion"}`` rows."""
    if (prompt is None) == (from_jsonl is None):
        raise ValueError("give either prompt and completion, or from_jsonl")
    if prompt is not None and completion is None:
        raise ValueError("prompt given without a completion")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if from_jsonl is not None:
        if not os.path.isfile(from_jsonl):
            raise FileNotFoundError(f"no such file: {from_jsonl}")
        if is_record_file(from_jsonl):
            return select_records(read_records(from_jsonl), credits, step, limit)
        pairs = read_pairs(from_jsonl)[:limit]
    else:
        pairs = [(prompt, completion, None)]
    if model is None:
        raise ValueError("a model is needed to compute attributions (--model)")
    prompts, completions = [p for p, _, _ in pairs], [c for _, c, _ in pairs]
    rewards = [r for _, _, r in pairs] if all(r is not None for _, _, r in pairs) else None
    return compute_records(model, prompts, completions, list(credits or [DEFAULT_CREDIT]), rewards=rewards,
                           **kwargs)
