"""OAR-P (OAR_SPEC §3): token importance by counterfactual replacement, exact and batched.

For every reasoning position t of a probe, replace token t by ``replace_id`` and measure how far the
outcome moves: ``KL(P_final || P_final')`` (modes ``last`` / ``answer_mean``) or ``φ - φ'``
(``answer_joint``). The fast path gives the same numbers as one full forward per copy while

- running many perturbed copies per forward (``chunk_size`` copies),
- reusing the key/value cache of the clean prefix: a chunk of copies sorted by position re-runs only
  from its earliest perturbed position (everything before it is unchanged, so the cache is exact),
- computing the LM head only at the answer-predicting positions (never ``[copies, L, V]``),
- stopping each forward at the last position the outcome reads (the closing ``}`` is never run).

Peak memory is bounded by ``chunk_size`` copies of one probe, not by the reasoning length.
"""

from __future__ import annotations

import copy

import torch

from oar.importance._common import check_inputs, divergence, outcome, resolve_replace_id, scoring_mode


def _segments(reasoning_mask: torch.Tensor, span: int | torch.Tensor | None) -> torch.Tensor:
    """``[B, L]`` long window id of each reasoning token (-1 elsewhere): one token per window by default,
    ``span`` consecutive reasoning tokens for an int, or the given ids (e.g. reasoning lines)."""
    rank = reasoning_mask.long().cumsum(dim=1) - 1
    if span is None:
        seg = rank
    elif isinstance(span, int):
        if span < 1:
            raise ValueError(f"span must be >= 1, got {span}")
        seg = rank // span
    else:
        if span.shape != reasoning_mask.shape:
            raise ValueError(f"span shape {tuple(span.shape)} != mask shape {tuple(reasoning_mask.shape)}")
        if (span[reasoning_mask] < 0).any():
            raise ValueError("span segment ids must be >= 0 on reasoning tokens")
        seg = span.long()
    return torch.where(reasoning_mask, seg, -1)


def _row_scores(
    model: torch.nn.Module,
    ids: torch.Tensor,
    seg: torch.Tensor,
    answer: torch.Tensor,
    mode: str,
    replace_id: int,
    chunk_size: int,
) -> torch.Tensor:
    """Scores ``[n]`` of one unpadded probe ``ids [n]`` with window ids ``seg [n]``, answer mask ``[n]``."""
    n = ids.shape[0]
    pos = torch.arange(n, device=ids.device)
    q = pos[answer] - 1  # positions predicting the answer tokens
    if mode == "last":
        q = q[:1]
    end = int(q[-1]) + 1  # the forward stops after the last position the outcome reads
    k = end - int(q[0])
    sel = torch.zeros(k, dtype=torch.bool, device=ids.device)
    sel[q - q[0]] = True
    targets = torch.zeros(k, dtype=torch.long, device=ids.device)
    targets[q - q[0]] = ids[q + 1]
    clean = outcome(model(ids[None, :end], logits_to_keep=k).logits, sel[None], targets[None], mode)

    in_window = seg >= 0
    windows, inverse = torch.unique(seg[in_window], return_inverse=True)
    first = torch.full_like(windows, n).scatter_reduce(0, inverse, pos[in_window], reduce="amin")
    order = torch.argsort(first)
    windows, first = windows[order], first[order]

    scores = torch.zeros(n, dtype=torch.float32, device=ids.device)
    prefix, cached = None, 0  # clean key/value cache of ids[:cached], batch 1
    for c0 in range(0, windows.shape[0], chunk_size):
        chunk = windows[c0 : c0 + chunk_size]
        lo = int(first[c0])
        if lo > cached:
            prefix = model(ids[None, cached:lo], past_key_values=prefix, use_cache=True, logits_to_keep=1)
            prefix, cached = prefix.past_key_values, lo
        hit = seg[None, lo:end] == chunk[:, None]  # [C, S]: the positions each copy replaces
        x = ids[lo:end].expand_as(hit).masked_fill(hit, replace_id)
        past = None
        if prefix is not None:
            past = copy.deepcopy(prefix)
            past.batch_repeat_interleave(chunk.shape[0])
        logits = model(x, past_key_values=past, use_cache=True, logits_to_keep=k).logits
        new = outcome(logits, sel.expand(hit.shape[0], -1), targets.expand(hit.shape[0], -1), mode)
        d = divergence(clean.expand(hit.shape[0], *clean.shape[1:]), new, mode)
        scores[lo:end] += (hit.to(d.dtype) * d[:, None]).sum(dim=0)
    return scores


def perturbation_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    reasoning_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    mode: str = "last",
    replace_id: int | None = None,
    chunk_size: int = 16,
    span: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """OAR-P importance of every reasoning token (exact; see the module docstring for the fast path).

    Args:
        model: a Hugging Face causal LM (any dtype; the outcome is computed in float32).
        input_ids / attention_mask: ``[B, L]`` probes (any padding side).
        reasoning_mask / answer_mask: ``[B, L]`` bool; reasoning tokens must precede the answer.
        mode: ``"last"``, ``"answer_mean"`` or ``"answer_joint"``.
        replace_id: the counterfactual token; default the model config's pad id.
        chunk_size: perturbed copies per forward (bounds peak memory).
        span: extension, not in the paper. ``k`` replaces windows of k consecutive reasoning tokens at
            once, a ``[B, L]`` long tensor of window ids (e.g. ``OutcomeProbe.line_segments``) replaces
            each window; every token of a window gets the window's score (k-fold fewer forwards).

    Returns:
        ``[B, L]`` float32 scores, 0 outside the reasoning and on rows without reasoning or answer.
    """
    check_inputs(input_ids, attention_mask, reasoning_mask, answer_mask, mode)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    replace_id = resolve_replace_id(model, replace_id)
    segments = _segments(reasoning_mask, span)
    scores = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    with torch.no_grad(), scoring_mode(model):
        for b in range(input_ids.shape[0]):
            keep = attention_mask[b].bool()
            if not (reasoning_mask[b].any() and answer_mask[b].any()):
                continue
            row = _row_scores(model, input_ids[b][keep], segments[b][keep], answer_mask[b][keep], mode,
                              replace_id, chunk_size)
            scores[b, keep] = row
    return scores


def perturbation_scores_naive(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    reasoning_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    mode: str = "last",
    replace_id: int | None = None,
    span: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """The definition of OAR-P, written plainly: one full forward (full logits) per perturbed copy.

    Same arguments and result as :func:`perturbation_scores`; for tests and benchmarks only (cost:
    one forward of the whole probe per reasoning token, memory ``[L, V]`` per copy).
    """
    check_inputs(input_ids, attention_mask, reasoning_mask, answer_mask, mode)
    replace_id = resolve_replace_id(model, replace_id)
    segments = _segments(reasoning_mask, span)
    position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp_min(0)
    scores = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)

    def read(x: torch.Tensor, b: int) -> torch.Tensor:
        logits = model(x[None], attention_mask=attention_mask[b : b + 1],
                       position_ids=position_ids[b : b + 1]).logits[0].float()
        answer_pos = answer_mask[b].nonzero().squeeze(1)
        if mode == "last":
            return torch.log_softmax(logits[answer_pos[0] - 1], dim=-1)
        if mode == "answer_mean":
            return torch.log_softmax(logits[answer_pos - 1].mean(dim=0), dim=-1)
        token_lp = torch.log_softmax(logits[answer_pos - 1], dim=-1)[torch.arange(len(answer_pos)), x[answer_pos]]
        return token_lp.mean()

    with torch.no_grad(), scoring_mode(model):
        for b in range(input_ids.shape[0]):
            if not (reasoning_mask[b].any() and answer_mask[b].any()):
                continue
            clean = read(input_ids[b], b)
            for w in segments[b][reasoning_mask[b]].unique():
                window = segments[b] == w
                new = read(input_ids[b].masked_fill(window, replace_id), b)
                if mode == "answer_joint":
                    score = clean - new
                else:
                    score = (clean.exp() * (clean - new)).sum()
                scores[b, window] = score
    return scores
