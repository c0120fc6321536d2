"""The outcome probe (OAR_SPEC §2): prompt ⊕ reasoning ⊕ conclude ⊕ answer ⊕ "}" for every completion.

Takes TRL's rollout layout (left-padded prompts, right-padded completions, masks decide what is padding,
so a pad id equal to the eos id is fine) and returns a right-padded :class:`ProbeBatch` plus the map from
probe positions back to completion positions. The reasoning tokens are the completion's own ids, never
re-tokenized; the reasoning/answer split comes from :func:`oar.answer_span.locate_answer`, the locator
the grader uses. A tokenizer object is passed in; nothing here imports transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from oar.answer_span import ANSWER_PHRASES, BOX_MARKERS, locate_answer

DEFAULT_CONCLUDE = "\n\nTherefore, the final answer is \\boxed{"
ANSWER_SOURCES = ("completion", "reference")  # the probe's answer: the completion's own, or the dataset's


@dataclass
class ProbeBatch:
    """A batch of outcome probes, right-padded to length ``L``; ``T`` is the completion length.

    ``input_ids`` / ``attention_mask``: ``[B, L]`` long. ``reasoning_mask`` / ``answer_mask``: ``[B, L]``
    bool, the reasoning tokens and the answer tokens (not the closing ``}``). ``completion_index``:
    ``[B, L]`` long, the completion position of each reasoning token, -1 elsewhere.
    ``completion_reasoning_mask`` / ``completion_statement_mask``: ``[B, T]`` bool, the reasoning tokens and
    the final-answer statement (from its marker to the end of the completion) in completion coordinates.
    Flags ``[B]`` bool: ``no_answer`` (no final answer located, or an empty reference), ``too_short``
    (< 2 reasoning tokens), ``truncated`` (prompt cut from the left to fit ``max_length``), ``too_long``
    (the reasoning alone does not fit). ``valid`` = none of no_answer / too_short / too_long; an invalid
    row is a single attended pad token with empty masks, so every scorer gives it zeros.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    reasoning_mask: torch.Tensor
    answer_mask: torch.Tensor
    completion_index: torch.Tensor
    completion_reasoning_mask: torch.Tensor
    completion_statement_mask: torch.Tensor
    valid: torch.Tensor
    no_answer: torch.Tensor
    too_short: torch.Tensor
    truncated: torch.Tensor
    too_long: torch.Tensor

    def to_completion(self, scores: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """Map ``[B, L]`` probe scores onto ``[B, T]`` completion positions (``fill`` off the reasoning)."""
        if scores.shape != self.input_ids.shape:
            raise ValueError(f"scores shape {tuple(scores.shape)} != probe shape {tuple(self.input_ids.shape)}")
        out = torch.full(self.completion_reasoning_mask.shape, fill, dtype=scores.dtype, device=scores.device)
        rows, cols = self.reasoning_mask.nonzero(as_tuple=True)
        out[rows, self.completion_index[rows, cols]] = scores[rows, cols]
        return out

    def to(self, device: torch.device | str) -> ProbeBatch:
        return ProbeBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def rollout_tensors(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token-id lists in TRL's rollout layout: ``prompt_ids / prompt_mask [B, P]`` left-padded and
    ``completion_ids / completion_mask [B, T]`` right-padded (long masks, 1 on real tokens; width >= 1)."""

    def pad(rows: Sequence[Sequence[int]], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(1, max((len(r) for r in rows), default=0))
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for b, r in enumerate(rows):
            if len(r):
                cols = slice(width - len(r), width) if left else slice(0, len(r))
                ids[b, cols] = torch.as_tensor(list(r), dtype=torch.long)
                mask[b, cols] = 1
        return ids, mask

    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    return (*pad(prompts, left=True), *pad(completions, left=False))


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _tokens_before(tokenizer: Any, ids: Sequence[int], char_pos: int) -> tuple[int, int]:
    """Largest ``k`` with ``len(decode(ids[:k])) <= char_pos``, and that length (binary search).

    Cumulative decode lengths, not per-token decodes, so multi-byte characters split across byte-level
    BPE tokens are measured correctly.
    """
    lo, hi, lo_len = 0, len(ids), 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        n = len(_decode(tokenizer, ids[:mid]))
        if n <= char_pos:
            lo, lo_len = mid, n
        else:
            hi = mid - 1
    return lo, lo_len


def _prefix_mask_length(mask: torch.Tensor, name: str) -> torch.Tensor:
    """``[B]`` lengths of right-padded ``[B, T]`` masks; ValueError if a mask has holes."""
    n = mask.sum(dim=1)
    expected = torch.arange(mask.shape[1], device=mask.device)[None, :] < n[:, None]
    if not torch.equal(mask, expected):
        raise ValueError(f"{name} must be right-padded (ones then zeros on every row)")
    return n


@dataclass(frozen=True)
class _RowLayout:
    """One completion's probe before padding: its ids (a single pad id for an invalid row) and where its parts are.

    Probe positions: the reasoning is ``[reasoning_start, reasoning_start + reasoning_len)``, the answer
    ``[answer_start, answer_start + answer_len)``. Completion positions: ``completion_len`` real tokens, the
    final-answer statement from ``statement_start`` (``completion_len`` when no answer was located).
    """

    ids: list[int]
    reasoning_start: int
    reasoning_len: int
    answer_start: int
    answer_len: int
    completion_len: int
    statement_start: int
    no_answer: bool
    too_short: bool
    truncated: bool
    too_long: bool


def _assemble(rows: list[_RowLayout], completion_width: int, pad_id: int) -> ProbeBatch:
    """Right-pad the row layouts into a :class:`ProbeBatch` (on the CPU): the masks from each row's named ``[B]``
    starts and lengths, compared against position ranges, with no loop over tokens."""
    B, L = len(rows), max(len(r.ids) for r in rows)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(B, L, dtype=torch.long)
    for b, r in enumerate(rows):
        input_ids[b, : len(r.ids)] = torch.tensor(r.ids, dtype=torch.long)
        attention_mask[b, : len(r.ids)] = 1

    def column(name: str, dtype: torch.dtype = torch.long) -> torch.Tensor:  # [B, 1]
        return torch.tensor([getattr(r, name) for r in rows], dtype=dtype)[:, None]

    reasoning_start, reasoning_len = column("reasoning_start"), column("reasoning_len")
    answer_start, answer_len = column("answer_start"), column("answer_len")
    completion_len, statement_start = column("completion_len"), column("statement_start")
    flags = {k: column(k, torch.bool)[:, 0] for k in ("no_answer", "too_short", "truncated", "too_long")}
    valid = ~(flags["no_answer"] | flags["too_short"] | flags["too_long"])

    pos = torch.arange(L)[None, :]
    reasoning_mask = (pos >= reasoning_start) & (pos < reasoning_start + reasoning_len)
    t = torch.arange(completion_width)[None, :]
    statement = (t >= statement_start) & (t < completion_len)
    return ProbeBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        reasoning_mask=reasoning_mask,
        answer_mask=(pos >= answer_start) & (pos < answer_start + answer_len),
        completion_index=torch.where(reasoning_mask, pos - reasoning_start, -1),
        completion_reasoning_mask=t < reasoning_len,
        completion_statement_mask=statement & valid[:, None],
        valid=valid,
        **flags,
    )


class OutcomeProbe:
    """Builds outcome probes (OAR_SPEC §2) from rollout token ids: ``probe(prompt_ids, prompt_mask, completion_ids,
    completion_mask, references=None) -> ProbeBatch``.

    Args:
        tokenizer: a Hugging Face tokenizer (anything with ``decode`` and ``__call__``).
        conclude: text inserted between the reasoning and the answer; tokenized once.
        answer_source: one of ``ANSWER_SOURCES``: ``"completion"`` (the completion's own answer tokens) or
            ``"reference"`` (the dataset's answer, tokenized).
        max_length: longest probe; longer probes lose prompt tokens from the left (flag ``truncated``).
        box_markers / phrases: passed to :func:`oar.answer_span.locate_answer`.
        pad_id: id used for padding the probe; default the tokenizer's pad id (else eos, else 0).
    """

    def __init__(
        self,
        tokenizer: Any,
        conclude: str = DEFAULT_CONCLUDE,
        answer_source: str = "completion",
        max_length: int | None = None,
        box_markers: tuple[str, ...] = BOX_MARKERS,
        phrases: tuple[str, ...] = ANSWER_PHRASES,
        pad_id: int | None = None,
    ) -> None:
        if answer_source not in ANSWER_SOURCES:
            raise ValueError(f"answer_source must be 'completion' or 'reference', got {answer_source!r}")
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self.tokenizer = tokenizer
        self.conclude = conclude
        self.answer_source = answer_source
        self.max_length = max_length
        self.box_markers = box_markers
        self.phrases = phrases
        self.conclude_ids: list[int] = self._encode(conclude)
        self.close_ids: list[int] = self._encode("}")
        if pad_id is None:
            pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad_id) if pad_id is not None else 0

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _answer_ids(self, ids: list[int], text: str, answer_start: int, answer_end: int) -> list[int]:
        """The completion's own answer ids when the answer is token-aligned, else the answer re-tokenized."""
        a0, len0 = _tokens_before(self.tokenizer, ids, answer_start)
        a1, len1 = _tokens_before(self.tokenizer, ids, answer_end)
        if len0 == answer_start and len1 == answer_end and a1 > a0:
            return ids[a0:a1]
        return self._encode(text[answer_start:answer_end])

    def _layout_row(self, prompt: list[int], completion: list[int], reference: str | None) -> _RowLayout:
        """One row: locate the final answer in the completion's text, split reasoning from it, build
        prompt ⊕ reasoning ⊕ conclude ⊕ answer ⊕ "}" (cutting the prompt from the left to ``max_length``) and
        flag what makes the row invalid."""
        text = _decode(self.tokenizer, completion)
        span = locate_answer(text, self.box_markers, self.phrases)
        answer: list[int] = []
        r = 0
        if span is not None:
            r, _ = _tokens_before(self.tokenizer, completion, span.start)
            if self.answer_source == "completion":
                answer = self._answer_ids(completion, text, span.answer_start, span.answer_end)
            else:
                answer = self._encode(str(reference).strip())
        tail = self.conclude_ids + answer + self.close_ids
        excess = len(prompt) + r + len(tail) - self.max_length if self.max_length else 0
        no_answer, too_short, too_long = not answer, bool(answer) and r < 2, excess > len(prompt)
        common = dict(completion_len=len(completion), statement_start=r if span is not None else len(completion),
                      no_answer=no_answer, too_short=too_short, truncated=excess > 0, too_long=too_long)
        if no_answer or too_short or too_long:
            return _RowLayout([self.pad_id], 0, 0, len(self.conclude_ids), 0, **common)
        prompt = prompt[max(excess, 0) :]
        return _RowLayout(prompt + completion[:r] + tail, len(prompt), r, len(prompt) + r + len(self.conclude_ids),
                          len(answer), **common)

    def __call__(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
        references: Sequence[str] | None = None,
    ) -> ProbeBatch:
        """Build the probes of a rollout batch.

        Args:
            prompt_ids / prompt_mask: ``[B, P]``, any padding side (the mask decides what is real).
            completion_ids / completion_mask: ``[B, T]``, right-padded (TRL's layout).
            references: ``B`` reference answers; required when ``answer_source == "reference"``.

        Returns:
            A :class:`ProbeBatch` on the device of ``completion_ids``.
        """
        if prompt_ids.shape != prompt_mask.shape or completion_ids.shape != completion_mask.shape:
            raise ValueError("ids and masks must have the same shapes")
        if prompt_ids.shape[0] != completion_ids.shape[0]:
            raise ValueError(f"{prompt_ids.shape[0]} prompts but {completion_ids.shape[0]} completions")
        B, T = completion_ids.shape
        if self.answer_source == "reference" and (references is None or len(references) != B):
            raise ValueError("answer_source='reference' needs one reference answer per completion")
        n_completion = _prefix_mask_length(completion_mask.bool(), "completion_mask").tolist()
        prompt_keep = prompt_mask.bool().cpu().tolist()
        rows = [
            self._layout_row([t for t, k in zip(ids, keep, strict=True) if k], completion[:n],
                             references[b] if self.answer_source == "reference" else None)
            for b, (ids, keep, completion, n) in enumerate(zip(prompt_ids.cpu().tolist(), prompt_keep,
                                                                completion_ids.cpu().tolist(), n_completion,
                                                                strict=True))
        ]
        return _assemble(rows, T, self.pad_id).to(completion_ids.device)
