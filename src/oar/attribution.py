"""Token-credit records: what the trainer dumps and ``oar attribute`` renders (one JSON object a line).

Also computes them: :func:`attribute_batch` runs the outcome probe, a scorer and Bi-Level reshaping on
(prompt, completion) texts, and :func:`record_correlation` compares the credit two methods apply.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from oar.files import append_jsonl, iter_jsonl


@dataclass
class AttributionRecord:
    """One completion's token credit. All lists have one entry per completion token.

    ``tokens``: the token texts; their concatenation is the completion text (see :func:`decode_tokens`).
    ``scores``: the credit method's raw per-token signal (0 where it does not act). ``weights``: the factor on
    the sequence advantage (1 where the method does not act; Bi-Level weights for OAR). ``offsets``: added to
    the advantage by additive methods (KTAE; for ``replace`` methods such as GTPO, weight 0 and the offset is the
    token advantage), else None.
    ``reasoning`` / ``answer``: which tokens are reasoning and which the answer statement.
    """

    tokens: list[str]
    scores: list[float]
    weights: list[float]
    reasoning: list[bool]
    answer: list[bool]
    credit: str
    prompt: str = ""
    advantage: float | None = None
    reward: float | None = None
    step: int | None = None
    offsets: list[float] | None = None  # additive credit methods (combine "add"): the per-token offset

    def __post_init__(self) -> None:
        n = len(self.tokens)
        for name in ("scores", "weights", "reasoning", "answer", "offsets"):
            if getattr(self, name) is not None and len(getattr(self, name)) != n:
                raise ValueError(f"AttributionRecord.{name} has {len(getattr(self, name))} entries, tokens has {n}")

    @property
    def text(self) -> str:
        """The completion text (the tokens joined)."""
        return "".join(self.tokens)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> AttributionRecord:
        missing = [k for k in ("tokens", "scores", "weights", "reasoning", "answer", "credit") if k not in data]
        if missing:
            raise ValueError(f"attribution record is missing fields {missing}")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def append_records(path: str | os.PathLike, records: Iterable[AttributionRecord]) -> None:
    """Append records to a JSONL file in one write (a reader never sees half a line; :func:`oar.files.append_jsonl`)."""
    append_jsonl(path, [r.to_json() for r in records], fsync=True)


def read_records(path: str | os.PathLike) -> list[AttributionRecord]:
    """Read every record of a JSONL file; a bad line raises ``ValueError`` naming its line number."""
    out = []
    for i, row in iter_jsonl(path):
        try:
            out.append(AttributionRecord.from_json(row))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}:{i}: not an attribution record ({err})") from err
    return out


def read_pairs(path: str | os.PathLike) -> list[tuple[str, str, float | None]]:
    """Read ``{"prompt": str, "completion": str, "reward": number (optional)}`` rows of a JSONL file (texts still
    to be attributed); the reward is None where absent."""
    out = []
    for i, row in iter_jsonl(path):
        if not isinstance(row.get("prompt"), str) or not isinstance(row.get("completion"), str):
            raise ValueError(f"{path}:{i}: expected string fields 'prompt' and 'completion'")
        reward = row.get("reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
            raise ValueError(f"{path}:{i}: 'reward' must be a number, got {reward!r}")
        out.append((row["prompt"], row["completion"], None if reward is None else float(reward)))
    return out


def is_record_file(path: str | os.PathLike) -> bool:
    """True when the first row of a JSONL file is an attribution record (has ``tokens``), False when it is
    a (prompt, completion) row; ``ValueError`` for an empty file."""
    for _, row in iter_jsonl(path):
        return "tokens" in row
    raise ValueError(f"{path}: no rows")


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def decode_tokens(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Token texts whose concatenation is ``tokenizer.decode(ids)`` (incremental decoding).

    A byte-level BPE token holding part of a multi-byte character gets ``""``; the token completing the
    character carries it (a character cut off at the end stays with the last token, as ``"\ufffd"``).
    Whitespace and newlines are kept as they decode. Each token is decoded in a short window after the
    last complete one, so the cost is linear in the length.
    """
    ids = [int(i) for i in ids]
    out, prefix, read = [], 0, 0
    for k in range(len(ids)):
        done, text = _decode(tokenizer, ids[prefix:read]), _decode(tokenizer, ids[prefix : k + 1])
        complete = len(text) > len(done) and text.startswith(done) and not text.endswith("\ufffd")
        out.append(text[len(done) :] if complete else "")
        if complete:
            prefix, read = read, k + 1
    joined, full = "".join(out), _decode(tokenizer, ids)
    if ids and joined != full and full.startswith(joined):
        out[-1] += full[len(joined) :]
    return out


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks 0..n-1 of a 1-D tensor, ties sharing their average rank."""
    ordered, order = torch.sort(x)
    _, inverse, counts = torch.unique_consecutive(ordered, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    average = ends - (counts.double() + 1) / 2
    ranks = torch.empty(x.numel(), dtype=torch.float64)
    ranks[order] = average[inverse]
    return ranks


def rank_correlation(a: Sequence[float] | torch.Tensor, b: Sequence[float] | torch.Tensor) -> float:
    """Spearman's rank correlation of two equally long score vectors (average ranks for ties).

    NaN when fewer than 2 entries or when either vector is constant.
    """
    a = torch.as_tensor(a, dtype=torch.float64).flatten()
    b = torch.as_tensor(b, dtype=torch.float64).flatten()
    if a.numel() != b.numel():
        raise ValueError(f"rank_correlation needs equal lengths, got {a.numel()} and {b.numel()}")
    if a.numel() < 2:
        return float("nan")
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = (ra.square().sum() * rb.square().sum()).sqrt()
    return float((ra * rb).sum() / denom) if denom > 0 else float("nan")


def token_advantages(record: AttributionRecord, advantage: float | None = None) -> list[float]:
    """Per token, the advantage ``record``'s method trains on: ``A * weight (+ offset)``, ``A`` being
    ``advantage``, else the record's own, else 1."""
    a = advantage if advantage is not None else record.advantage if record.advantage is not None else 1.0
    offsets = record.offsets or [0.0] * len(record.weights)
    return [a * w + o for w, o in zip(record.weights, offsets, strict=True)]


def record_correlation(x: AttributionRecord, y: AttributionRecord) -> float:
    """Spearman correlation of the credit two records of one completion apply, over the tokens that are reasoning
    in both: their weights, or, when either method adds to or replaces the advantage, their token advantages
    (:func:`token_advantages`, at the advantage the records carry). Not the raw scores: a control such as
    ``shuffle:oar-g`` keeps OAR-G's scores and permutes the weights it applies."""
    if len(x.tokens) != len(y.tokens):
        raise ValueError(f"records differ in length ({len(x.tokens)} vs {len(y.tokens)} tokens)")
    both = [i for i, (p, q) in enumerate(zip(x.reasoning, y.reasoning, strict=True)) if p and q]
    if x.offsets is None and y.offsets is None:
        a, b = x.weights, y.weights
    else:
        adv = next((r.advantage for r in (x, y) if r.advantage is not None), None)
        a, b = token_advantages(x, adv), token_advantages(y, adv)
    return rank_correlation([a[i] for i in both], [b[i] for i in both])


def _encode(tokenizer: Any, text: str, chat: bool, prompt: bool) -> list[int]:
    if prompt and chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("chat=True but the tokenizer has no chat template")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]
        return list(ids)
    return list(tokenizer(text, add_special_tokens=prompt)["input_ids"])


def attribute_batch(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    completions: Sequence[str],
    credit: str = "oar-g",
    *,
    batch_size: int = 8,
    chat: bool = False,
    probe: Any = None,
    rewards: Sequence[float] | None = None,
    generator: torch.Generator | None = None,
    **options: Any,
) -> list[AttributionRecord]:
    """Token credit of each (prompt, completion) with :func:`oar.credit.token_credit` (what the trainer runs).

    Args:
        model / tokenizer: a causal LM (its current mode is restored afterwards) and its tokenizer.
        prompts / completions: texts, one prompt per completion. ``chat``: wrap each prompt in the
            tokenizer's chat template (as an instruct model saw it when generating).
        credit: a credit and its options in one value (``oar-g``, ``oar-p@horizon=2``, ``shuffle:oar-g``, ...:
            :class:`oar.credit.CreditSpec`); records carry its canonical text.
        probe: an :class:`oar.probe.OutcomeProbe`; default one with the default conclude text.
        rewards: each completion's reward, for methods that read the rollout group (``ktae``, ``gtpo``); the
            completions of one prompt text form a group, and the GRPO advantage is computed within it.
        generator: random source of the scorer and the controls. ``options``: more of the method's options
            (e.g. ``tau=0.5``), added to those ``credit`` names (an option set both ways must agree).

    Returns:
        One :class:`AttributionRecord` per completion, in order.
    """
    from oar.credit import CreditBatch, CreditSpec, token_credit
    from oar.probe import OutcomeProbe, rollout_tensors

    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    spec = CreditSpec.parse(credit).merged(options, "options")
    resolved = spec.resolve()
    method = resolved.method
    if method.needs_group and (rewards is None or len(rewards) != len(completions)):
        raise ValueError(f"credit {credit!r} reads the rollout group: pass one reward per completion (rewards=)")
    if resolved.options.get("rule") in ("sign", "process") and (rewards is None or len(rewards) != len(completions)):
        raise ValueError(f"credit {credit!r}: rule {resolved.options['rule']!r} reads the sign of each completion's "
                         "advantage: pass one reward per completion (rewards=)")
    probe = probe or OutcomeProbe(tokenizer)
    device = next(model.parameters()).device
    c_rows = [_encode(tokenizer, c, chat, False) for c in completions]
    p_ids, p_mask, c_ids, c_mask = rollout_tensors([_encode(tokenizer, p, chat, True) for p in prompts], c_rows,
                                                   probe.pad_id)
    ids = {p: i for i, p in enumerate(dict.fromkeys(prompts))}
    group = torch.tensor([ids[p] for p in prompts], device=device)
    r = torch.tensor([float(x) for x in rewards], dtype=torch.float32, device=device) if rewards else None
    adv = None
    if r is not None:  # GRPO advantages within each prompt's completions (TRL's formula)
        n = torch.zeros(len(ids), device=device).index_add_(0, group, torch.ones_like(r))
        mean = torch.zeros_like(n).index_add_(0, group, r) / n
        var = torch.zeros_like(n).index_add_(0, group, (r - mean[group]) ** 2) / (n - 1).clamp_min(1)
        adv = (r - mean[group]) / (var.sqrt()[group] + 1e-4)
    batch = CreditBatch(p_ids.to(device), p_mask.to(device), c_ids.to(device), c_mask.to(device), advantages=adv,
                        rewards=r, group=group, model=model, tokenizer=tokenizer)
    was_training = model.training
    model.eval()
    try:
        tc = token_credit(resolved, batch, probe=probe, batch_size=batch_size, generator=generator)
    finally:
        model.train(was_training)
    out = []
    for b, ids in enumerate(c_rows):
        k = len(ids)
        out.append(AttributionRecord(
            tokens=decode_tokens(tokenizer, ids), scores=tc.scores[b, :k].tolist(),
            weights=tc.weights[b, :k].tolist(), reasoning=tc.mask[b, :k].tolist(),
            answer=tc.answer_mask[b, :k].tolist(), credit=str(spec), prompt=prompts[b],
            reward=float(rewards[b]) if rewards else None, advantage=float(adv[b]) if adv is not None else None,
            offsets=tc.offsets[b, :k].tolist() if tc.combine in ("add", "replace") else None,
        ))
    return out


def attribute(model: Any, tokenizer: Any, prompt: str, completion: str, credit: str = "oar-g",
              **kwargs: Any) -> AttributionRecord:
    """Token credit of one completion; see :func:`attribute_batch` for the arguments."""
    return attribute_batch(model, tokenizer, [prompt], [completion], credit, **kwargs)[0]
