"""Oracle credits: token credit read off the lab task's ground truth, an upper bound for every learned credit.

The lab knows what no scorer knows: which written step of a sampled completion is the first wrong one
(:func:`oar.lab.task.first_wrong_step`) and which tokens the answer is computed from (the digits of the written
steps, :func:`oar.lab.task.step_digit_positions`). Registered as credits when :mod:`oar.lab` is imported, they run
under the same trainer, combine modes and controls as any other credit (docs/lab.md, "Oracle credits"):

- ``oracle-blame``: a failed completion (``A < 0``) with a wrong written step puts ``floor`` on its correct prefix
  and the rest of the mass (masked mean 1) on the first wrong step and everything after it; other rows uniform.
- ``oracle-process``: perfect *blame* importance (1 from a failed completion's first wrong step on, 0 elsewhere)
  under the ``process`` rule (its default): weight 0 on the correct prefix, 1 from the first wrong step on (mass not
  preserved); other rows uniform. ``rule=`` gives the same importance under any other rule.
- ``oracle-oar``: perfect *pivotal* importance (1 on the step digits of the reasoning, 0 elsewhere, on every scored
  row) under OAR's own Bi-Level reshaping (OAR_SPEC §4, same probe, mask and defaults as ``oar-g``; the ``rule``
  default). It separates OAR's reshaping rule from OAR's attribution; ``rule=`` gives it under any other rule.

Lab-only. The texts are read with the batch's tokenizer (``CreditBatch.tokenizer``, the probe's for
``oracle-oar``) and mapped back to tokens by each token's character span (:func:`oar.lab.lm.token_char_spans`;
the language-model lab's BPE tokens); without one, as the character lab's one-character-per-token ids
(:func:`oar.lab.tokenizer.decode_chars`).
"""

from __future__ import annotations

import torch

from oar.credit import CreditBatch, bilevel_effect, register_credit
from oar.credit.catalogue import BILEVEL
from oar.credit.options import Option
from oar.lab.lm import char_positions_to_tokens, token_char_spans
from oar.lab.task import first_wrong_step, lab_prompt, step_digit_positions
from oar.lab.tokenizer import decode_chars
from oar.reshape import FLOOR, FLOOR_RANGE

ORACLE_PAPER = "upper bound of this project (lab ground truth)"
PROCESS_PAPER = "process supervision's first-error labels (Lightman et al., arXiv 2305.20050) as credit"


def blame_mask(batch: CreditBatch) -> torch.Tensor:
    """``[B, T]`` bool: for each failed completion (``advantages < 0``) with a wrong written step, the tokens from
    the start of its first wrong step to its end (within ``completion_mask``); all False on other rows."""
    if batch.advantages is None:
        raise ValueError("oracle credits need CreditBatch.advantages (the rows with A < 0 are the failed ones)")
    cmask = batch.completion_mask.bool()
    out = torch.zeros_like(cmask)
    for r in (batch.advantages < 0).nonzero().squeeze(1).tolist():
        prompt, _ = _text(batch.tokenizer, batch.prompt_ids[r][batch.prompt_mask[r].bool()].tolist())
        completion, spans = _text(batch.tokenizer, batch.completion_ids[r].tolist())
        span = first_wrong_step(lab_prompt(prompt), completion)
        if span is not None:
            first = next(t for t, (_, end) in enumerate(spans) if end > span[0])
            out[r, first:] = cmask[r, first:]
    return out


def _text(tokenizer, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The text of token ``ids`` and each token's character span in it (the char lab's ids without a tokenizer)."""
    if tokenizer is None:
        return decode_chars(ids), [(i, i + 1) for i in range(len(ids))]
    return tokenizer.decode(ids, skip_special_tokens=True), token_char_spans(tokenizer, ids)


def blame_scores(batch: CreditBatch) -> torch.Tensor:
    """``[B, T]`` float32: 1 on :func:`blame_mask`, 0 elsewhere."""
    return blame_mask(batch).float()


def _split(scores: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The flagged tokens (``scores > 0.5`` within ``mask``), their count and the unflagged count per row, and
    whether a row has both (only such rows are reshaped)."""
    flagged = mask & (scores > 0.5)
    n1, n0 = flagged.sum(dim=1, keepdim=True), (mask & ~flagged).sum(dim=1, keepdim=True)
    return flagged, n1, n0


def mass_on_flagged(scores: torch.Tensor, mask: torch.Tensor, floor: float = FLOOR) -> torch.Tensor:
    """``[B, T]`` weights: ``floor`` on a row's unflagged tokens, the rest of the mass spread evenly over its flagged
    ones (masked mean exactly 1); rows without both kinds of token stay at 1."""
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"floor must be in [0, 1], got {floor!r}")
    flagged, n1, n0 = _split(scores, mask)
    high = (n1 + n0 - n0 * floor) / n1.clamp_min(1)
    w = torch.where(flagged, high.to(torch.float32), torch.full_like(scores, floor, dtype=torch.float32))
    return torch.where((n1 > 0) & (n0 > 0), w, torch.ones_like(w))


def flagged_only(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` weights: 1 on a row's flagged tokens, 0 on the rest (mass not preserved); rows without both
    kinds of token stay at 1."""
    flagged, n1, n0 = _split(scores, mask)
    return torch.where((n1 > 0) & (n0 > 0), flagged.float(), torch.ones_like(scores, dtype=torch.float32))


def pivotal_scores(model: torch.nn.Module | None, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   reasoning_mask: torch.Tensor, answer_mask: torch.Tensor, probe=None) -> torch.Tensor:
    """``[B, L]`` float32 on outcome probes: 1 on the reasoning tokens covering a digit of a written step
    (:func:`oar.lab.task.step_digit_positions`), 0 elsewhere (the model is not used; ``probe``: its tokenizer
    reads the texts)."""
    scores = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    tokenizer = getattr(probe, "tokenizer", None)
    for r in range(input_ids.shape[0]):
        cols = reasoning_mask[r].nonzero().squeeze(1)
        text, spans = _text(tokenizer, input_ids[r, cols].tolist())
        digits = char_positions_to_tokens(spans, step_digit_positions(text))
        scores[r, cols[digits]] = 1.0
    return scores


def _lab_texts(effect):
    """``effect`` reading the steps of a batch without a tokenizer (nor a probe's) as the character lab's texts,
    as the oracles read them (one character per token); otherwise ``effect`` as it is."""
    import dataclasses
    import functools

    @functools.wraps(effect)
    def lab_effect(scores, mask, *args, batch=None, probe=None, **options):
        if batch is not None and batch.tokenizer is None and getattr(probe, "tokenizer", None) is None:
            batch = dataclasses.replace(batch, tokenizer=_char_tokenizer())
        return effect(scores, mask, *args, batch=batch, probe=probe, **options)

    return lab_effect


_CHAR_TOKENIZER: list = []


def _char_tokenizer():
    """The character lab's tokenizer, built once (its separator ids are cached per tokenizer object)."""
    if not _CHAR_TOKENIZER:
        from oar.lab.tokenizer import build_char_tokenizer

        _CHAR_TOKENIZER.append(build_char_tokenizer())
    return _CHAR_TOKENIZER[0]


register_credit(
    "oracle-blame", combine="multiply", needs_policy=False, needs_probe=False, lab_only=True,
    passes="0 (lab ground truth)",
    paper=ORACLE_PAPER, effect=mass_on_flagged, options={"floor": Option(FLOOR, float, FLOOR_RANGE)},
    summary="failed rows with a wrong written step: floor on the correct prefix, the mass on the first wrong "
            "step and after (mean 1); other rows uniform",
)(blame_scores)

register_credit(
    "oracle-process", combine="multiply", needs_policy=False, needs_probe=False, lab_only=True,
    passes="0 (lab ground truth)",
    paper=PROCESS_PAPER, effect=_lab_texts(bilevel_effect), groups=(BILEVEL.with_defaults(rule="process"),),
    summary="perfect blame importance (1 from a failed row's first wrong written step on) under the process rule: "
            "0 on the correct prefix, 1 from the first wrong step on (mass not preserved); other rows uniform",
)(blame_scores)

register_credit(
    "oracle-oar", combine="multiply", needs_policy=False, needs_probe=True, lab_only=True,
    passes="0 (lab ground truth)",
    paper=f"{ORACLE_PAPER}; OAR's Bi-Level reshaping (arXiv 2601.07408)",
    summary="perfect pivotal importance (1 on the digits of written steps, 0 elsewhere) under the rule, "
            "default OAR's Bi-Level weights",
    effect=_lab_texts(bilevel_effect), groups=(BILEVEL,),
)(pivotal_scores)
