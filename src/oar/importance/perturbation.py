"""OAR-P (OAR_SPEC §3): token importance by counterfactual replacement, exact and batched.

For every reasoning position t of a probe, replace token t by ``replace_id`` and measure how far the
outcome moves: ``KL(P_final || P_final')`` (modes ``last`` / ``answer_mean``) or ``φ - φ'``
(``answer_joint``). The fast path gives the same numbers as one full forward per copy while

- running the perturbed copies of all rows together, ``chunk_size`` copies per forward, sorted by suffix length,
- reusing the key/value cache of the clean pass: a copy re-runs only its row's suffix from (about) its perturbed
  position on top of its row's clean keys/values before it (everything before is unchanged, so this is exact),
- computing the LM head only at the answer-predicting positions (never ``[copies, L, V]``),
- stopping each forward at the last position the outcome reads (the closing ``}`` is never run).

Peak memory: the clean key/value cache of the call's rows plus, per forward, ``chunk_size`` gathered copies of a
row's prefix cache (about as much again when ``chunk_size`` equals the rows of a call) and their suffixes; not the
reasoning length.
"""

from __future__ import annotations

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


def _layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(keys, values)`` ``[N, heads, S, head_dim]`` per layer of a transformers cache."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def _batch_scores(
    model: torch.nn.Module,
    seqs: list[torch.Tensor],
    segs: list[torch.Tensor],
    answers: list[torch.Tensor],
    mode: str,
    replace_id: int,
    chunk_size: int,
) -> list[torch.Tensor]:
    """Scores ``[n_b]`` of unpadded probes ``seqs[b] [n_b]`` with window ids ``segs[b]`` and answer masks.

    Every sequence is cut after the last position its outcome reads and right-aligned at column ``E``, so each
    row's readout sits in the last ``K`` columns. One clean pass over all rows gives the clean outcome and the
    key/value cache. The perturbed copies of all rows are then sorted by suffix length and run ``chunk_size`` at a
    time: a copy re-runs its row's last ``S`` tokens (``S`` the longest suffix of its chunk, at least ``K``)
    on top of its row's clean cache before them, gathered from the clean pass."""
    from transformers import DynamicCache

    device = seqs[0].device
    R = len(seqs)
    reads = []  # per row: (end, positions predicting the answer)
    for ans in answers:
        q = ans.nonzero().squeeze(1) - 1
        q = q[:1] if mode == "last" else q
        reads.append((int(q[-1]) + 1, q))
    end = torch.tensor([e for e, _ in reads], device=device)
    E, K = int(end.max()), max(e - int(q[0]) for e, q in reads)
    col = torch.arange(E, device=device)
    offset = E - end  # row position p sits at column offset + p
    pos = col[None, :] - offset[:, None]  # [R, E] row position of each column (< 0: padding)
    x = torch.full((R, E), replace_id, dtype=torch.long, device=device)
    seg = torch.full((R, E), -1, dtype=torch.long, device=device)
    nxt = torch.zeros(R, E, dtype=torch.long, device=device)  # the token each column predicts
    predicting = torch.zeros(R, E, dtype=torch.bool, device=device)
    for b, (seq, sg, (e, q)) in enumerate(zip(seqs, segs, reads, strict=True)):
        x[b, E - e :], seg[b, E - e :], nxt[b, E - e :] = seq[:e], sg[:e], seq[1 : e + 1]
        predicting[b, q + E - e] = True
    real = pos >= 0
    targets = nxt[:, E - K :]
    sel = predicting[:, E - K :]
    # an explicit full-length cache: every layer keeps all E columns (a sliding-window layer would not)
    out = model(x, attention_mask=real.long(), position_ids=pos.clamp_min(0), past_key_values=DynamicCache(),
                use_cache=True, logits_to_keep=K)
    clean, kv = outcome(out.logits, sel, targets, mode), _layers(out.past_key_values)

    # one copy per (row, window): its row, window id and first replaced position, by suffix length
    in_window = seg >= 0
    stride = int(seg.max()) + 1
    key = torch.where(in_window, seg + torch.arange(R, device=device)[:, None] * stride, -1)  # unique per window
    windows, inverse = torch.unique(key[in_window], return_inverse=True)
    first = torch.full_like(windows, E).scatter_reduce(0, inverse, col.expand(R, E)[in_window], reduce="amin")
    row = torch.div(windows, stride, rounding_mode="floor")
    suffix = E - first
    order = torch.argsort(suffix, stable=True)
    row, first, windows, suffix = row[order], first[order], windows[order], suffix[order]

    scores = torch.zeros(R, E, dtype=torch.float32, device=device)
    for c0 in range(0, windows.shape[0], chunk_size):
        r, w = row[c0 : c0 + chunk_size], windows[c0 : c0 + chunk_size]
        S = max(int(suffix[c0 : c0 + chunk_size].max()), K)
        P = E - S  # cached columns: the row's clean keys/values before its last S tokens
        hit = key[r, P:] == w[:, None]  # [C, S] the positions each copy replaces
        ids = x[r, P:].masked_fill(hit, replace_id)
        mask = real[r]
        past = None
        if P > 0:
            past = DynamicCache()
            for layer, (k, v) in enumerate(kv):
                past.update(k[r, :, :P], v[r, :, :P], layer)
        logits = model(ids, attention_mask=mask.long(), position_ids=pos[r, P:].clamp_min(0), past_key_values=past,
                       use_cache=past is not None, logits_to_keep=K).logits
        d = divergence(clean[r], outcome(logits, sel[r], targets[r], mode), mode)
        scores.index_put_((r[:, None].expand_as(hit), torch.arange(P, E, device=device).expand_as(hit)),
                          torch.where(hit, d[:, None], 0.0), accumulate=True)  # a non-finite d stays in its window
    return [scores[b, E - e :] for b, (e, _) in enumerate(reads)]


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
    rows = (reasoning_mask.any(dim=1) & answer_mask.any(dim=1)).nonzero().squeeze(1).tolist()
    keep = [attention_mask[b].bool() for b in rows]
    with torch.no_grad(), scoring_mode(model):
        if rows:
            row_scores = _batch_scores(model, [input_ids[b][m] for b, m in zip(rows, keep, strict=True)],
                                       [segments[b][m] for b, m in zip(rows, keep, strict=True)],
                                       [answer_mask[b][m] for b, m in zip(rows, keep, strict=True)],
                                       mode, replace_id, chunk_size)
            for b, m, row in zip(rows, keep, row_scores, strict=True):
                scores[b, m.nonzero().squeeze(1)[: row.shape[0]]] = row
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
