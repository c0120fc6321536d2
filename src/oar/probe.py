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


@dataclass
class ProbeBatch:
    """A batch of outcome probes, right-padded to length ``L``; ``T`` is the completion length.

    ``input_ids`` / ``attention_mask``: ``[B, L]`` long. ``reasoning_mask`` / ``answer_mask``: ``[B, L]``
    bool, the reasoning tokens and the answer tokens (not the closing ``}``). ``completion_index``:
    ``[B, L]`` long, the completion position of each reasoning token, -1 elsewhere.
    ``completion_reasoning_mask`` / ``completion_answer_mask``: ``[B, T]`` bool, the reasoning tokens and
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
    completion_answer_mask: torch.Tensor
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


class OutcomeProbe:
    """Builds outcome probes (OAR_SPEC §2) from rollout token ids.

    Args:
        tokenizer: a Hugging Face tokenizer (anything with ``decode`` and ``__call__``).
        conclude: text inserted between the reasoning and the answer; tokenized once.
        answer_source: ``"completion"`` (the completion's own answer tokens) or ``"reference"`` (the
            dataset's answer, tokenized).
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
        if answer_source not in ("completion", "reference"):
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
        self._newline_ids: torch.Tensor | None = None

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _answer_ids(self, ids: list[int], text: str, answer_start: int, answer_end: int) -> list[int]:
        """The completion's own answer ids when the answer is token-aligned, else the answer re-tokenized."""
        a0, len0 = _tokens_before(self.tokenizer, ids, answer_start)
        a1, len1 = _tokens_before(self.tokenizer, ids, answer_end)
        if len0 == answer_start and len1 == answer_end and a1 > a0:
            return ids[a0:a1]
        return self._encode(text[answer_start:answer_end])

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
        device = completion_ids.device
        prompt_mask, completion_mask = prompt_mask.bool(), completion_mask.bool()
        n_completion = _prefix_mask_length(completion_mask, "completion_mask").tolist()
        prompt_rows = prompt_ids.cpu().tolist()
        prompt_keep = prompt_mask.cpu().tolist()
        completion_rows = completion_ids.cpu().tolist()

        flags = {k: [False] * B for k in ("no_answer", "too_short", "truncated", "too_long")}
        rows: list[tuple[list[int], int, int, int]] = []  # probe ids, prompt len, reasoning len, answer len
        n_reasoning, statement_start = [0] * B, [0] * B
        for b in range(B):
            ids = completion_rows[b][: n_completion[b]]
            text = _decode(self.tokenizer, ids)
            span = locate_answer(text, self.box_markers, self.phrases)
            answer: list[int] = []
            r = 0
            if span is not None:
                r, _ = _tokens_before(self.tokenizer, ids, span.start)
                if self.answer_source == "completion":
                    answer = self._answer_ids(ids, text, span.answer_start, span.answer_end)
                else:
                    answer = self._encode(str(references[b]).strip())
            statement_start[b] = r if span is not None else n_completion[b]
            prompt = [t for t, k in zip(prompt_rows[b], prompt_keep[b], strict=True) if k]
            tail = self.conclude_ids + answer + self.close_ids
            excess = len(prompt) + r + len(tail) - self.max_length if self.max_length else 0
            flags["no_answer"][b] = not answer
            flags["too_short"][b] = bool(answer) and r < 2
            flags["truncated"][b] = excess > 0
            flags["too_long"][b] = excess > len(prompt)
            if flags["no_answer"][b] or flags["too_short"][b] or flags["too_long"][b]:
                rows.append(([self.pad_id], 0, 0, 0))
                continue
            prompt = prompt[max(excess, 0) :]
            n_reasoning[b] = r
            rows.append((prompt + ids[:r] + tail, len(prompt), r, len(answer)))

        L = max(len(r[0]) for r in rows)
        input_ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros(B, L, dtype=torch.long)
        starts = torch.zeros(B, 3, dtype=torch.long)  # reasoning start, answer start, answer length
        for b, (probe, p, r, a) in enumerate(rows):
            input_ids[b, : len(probe)] = torch.tensor(probe, dtype=torch.long)
            attention_mask[b, : len(probe)] = 1
            starts[b] = torch.tensor([p, p + r + len(self.conclude_ids), a])

        pos = torch.arange(L)[None, :]
        n_r = torch.tensor(n_reasoning, dtype=torch.long)[:, None]
        reasoning_mask = (pos >= starts[:, :1]) & (pos < starts[:, :1] + n_r)
        answer_mask = (pos >= starts[:, 1:2]) & (pos < starts[:, 1:2] + starts[:, 2:3])
        completion_index = torch.where(reasoning_mask, pos - starts[:, :1], -1)
        t = torch.arange(T)[None, :]
        n_c = torch.tensor(n_completion, dtype=torch.long)[:, None]
        flag_t = {k: torch.tensor(v, dtype=torch.bool) for k, v in flags.items()}
        valid = ~(flag_t["no_answer"] | flag_t["too_short"] | flag_t["too_long"])
        statement = (t >= torch.tensor(statement_start)[:, None]) & (t < n_c)
        return ProbeBatch(
            input_ids=input_ids,
            attention_mask=attention_mask,
            reasoning_mask=reasoning_mask,
            answer_mask=answer_mask,
            completion_index=completion_index,
            completion_reasoning_mask=t < n_r,
            completion_answer_mask=statement & valid[:, None],
            valid=valid,
            **flag_t,
        ).to(device)

    build = __call__

    def line_segments(self, batch: ProbeBatch) -> torch.Tensor:
        """``[B, L]`` long: the reasoning line of each reasoning token (a line ends with a token holding
        ``"\\n"``), -1 elsewhere. Pass it as ``span=`` to :func:`oar.perturbation_scores` (extension)."""
        if self._newline_ids is None:
            vocab = len(self.tokenizer)
            pieces = self.tokenizer.batch_decode([[i] for i in range(vocab)], skip_special_tokens=False)
            self._newline_ids = torch.tensor([i for i, s in enumerate(pieces) if "\n" in s], dtype=torch.long)
        mask = batch.reasoning_mask
        newline = torch.isin(batch.input_ids, self._newline_ids.to(mask.device)) & mask
        before = newline.long().cumsum(dim=1) - newline.long()
        return torch.where(mask, before, -1)
