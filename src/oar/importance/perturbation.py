"""OAR-P (OAR_SPEC §3): token importance by counterfactual replacement, exact and batched.

For every reasoning position t of a probe, replace token t by ``replace_id`` and measure how far the
outcome moves: ``KL(P_final || P_final')`` (modes ``last`` / ``answer_mean``) or ``φ - φ'``
(``answer_joint``). The fast path gives the same numbers as one full forward per copy while

- running the perturbed copies of all rows together, ``chunk_size`` copies per forward, sorted by suffix length,
- reusing the key/value cache of the clean pass: a copy re-runs only its row's suffix from (about) its perturbed
  position on top of its row's clean keys/values before it (everything before is unchanged, so this is exact),
- computing the LM head only at the answer-predicting positions (never ``[copies, L, V]``),
- stopping each forward at the last position the outcome reads (the closing ``}`` is never run).

``horizon=W`` (extension, not in the paper) trades exactness for speed: a copy re-runs only the positions from its
window to ``W`` tokens after it, the positions after that keep their clean keys/values (stale: the perturbation
reaches the answer only through the window and the answer positions' own attention), and the positions that read
the answer are re-run on that mixed cache. ``W`` at least the distance to the answer is exact OAR-P.

Peak memory: the clean key/value cache of the call's rows plus, per forward, ``chunk_size`` gathered copies of a
row's prefix cache (about as much again when ``chunk_size`` equals the rows of a call) and their suffixes; not the
reasoning length. With a horizon: a flat copy of the clean cache, and per forward ``chunk_size`` gathered copies of
a row's whole cache.
"""

from __future__ import annotations

from typing import Any

import torch

from oar.importance._common import check_inputs, divergence, outcome, resolve_replace_id, scoring_mode


def line_segments(input_ids: torch.Tensor, reasoning_mask: torch.Tensor, tokenizer: Any) -> torch.Tensor:
    """``[B, L]`` long: the reasoning line of each reasoning token of a probe (a line ends with a token whose text
    holds ``"\\n"``), -1 elsewhere; pass it as ``span=`` to :func:`perturbation_scores` (extension). Decodes the
    tokenizer's vocabulary once per call to find the newline tokens."""
    pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
    newline_ids = torch.tensor([i for i, s in enumerate(pieces) if "\n" in s], dtype=torch.long)
    newline = torch.isin(input_ids, newline_ids.to(input_ids.device)) & reasoning_mask
    before = newline.long().cumsum(dim=1) - newline.long()
    return torch.where(reasoning_mask, before, -1)


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
    horizon: int | None = None,
) -> list[torch.Tensor]:
    """Scores ``[n_b]`` of unpadded probes ``seqs[b] [n_b]`` with window ids ``segs[b]`` and answer masks.

    Every sequence is cut after the last position its outcome reads and right-aligned at column ``E``, so each
    row's readout sits in the last ``K`` columns. One clean pass over all rows gives the clean outcome and the
    key/value cache. The perturbed copies of all rows are then sorted by suffix length and run ``chunk_size`` at a
    time: a copy re-runs its row's last ``S`` tokens (``S`` the longest suffix of its chunk, at least ``K``)
    on top of its row's clean cache before them, gathered from the clean pass. With a ``horizon``, a chunk holds
    copies of rows with the same readout length k; it re-runs the columns from its first replaced position to the
    last one its copies re-run, then the last k columns on each copy's mixed cache (:func:`_mixed_cache`)."""
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
    if horizon is not None:  # [R * E, heads, head_dim] per layer: any (row, column) list gathers in one index
        flat = [(k.transpose(1, 2).reshape(R * E, k.shape[1], k.shape[3]),
                 v.transpose(1, 2).reshape(R * E, v.shape[1], v.shape[3])) for k, v in kv]

    # one copy per (row, window): its row, window id, first and last replaced positions, by suffix length
    in_window = seg >= 0
    stride = int(seg.max()) + 1
    key = torch.where(in_window, seg + torch.arange(R, device=device)[:, None] * stride, -1)  # unique per window
    windows, inverse = torch.unique(key[in_window], return_inverse=True)
    first = torch.full_like(windows, E).scatter_reduce(0, inverse, col.expand(R, E)[in_window], reduce="amin")
    last = torch.full_like(windows, -1).scatter_reduce(0, inverse, col.expand(R, E)[in_window], reduce="amax")
    row = torch.div(windows, stride, rounding_mode="floor")
    suffix = E - first
    # readout columns per copy: K for the exact path (one pass per chunk), the row's own k with a horizon
    row_k = torch.tensor([e - int(q[0]) for e, q in reads], device=device)
    reads_k = row_k[row] if horizon is not None else torch.full_like(row, K)
    order = torch.argsort(reads_k * (E + 1) + suffix, stable=True)
    row, first, last, windows, suffix, reads_k = (t[order] for t in (row, first, last, windows, suffix, reads_k))

    scores = torch.zeros(R, E, dtype=torch.float32, device=device)
    c0 = 0
    while c0 < windows.shape[0]:
        c1 = c0 + int((reads_k[c0 : c0 + chunk_size] == reads_k[c0]).sum())  # sorted: one readout length per chunk
        r, w, k = row[c0:c1], windows[c0:c1], int(reads_k[c0])
        hit = key[r] == w[:, None]  # [C, E] the positions each copy replaces
        ids = x[r].masked_fill(hit, replace_id)
        if horizon is None:
            P = E - max(int(suffix[c0:c1].max()), K)  # cached columns: the clean keys/values before the suffix
            past = _cache([(keys[r, :, :P], values[r, :, :P]) for keys, values in kv]) if P > 0 else None
        else:
            P = E - k  # the readout columns run on each copy's mixed cache
            past = _mixed_cache(model, flat, r, ids, real[r], pos[r], first[c0:c1],
                                (last[c0:c1] + horizon + 1).clamp_max(P), P)
        logits = model(ids[:, P:], attention_mask=real[r].long(), position_ids=pos[r, P:].clamp_min(0),
                       past_key_values=past, use_cache=past is not None, logits_to_keep=k).logits
        d = divergence(clean[r], outcome(logits, sel[r, K - k :], targets[r, K - k :], mode), mode)
        scores.index_put_((r[:, None].expand_as(hit), col.expand_as(hit)), torch.where(hit, d[:, None], 0.0),
                          accumulate=True)  # a non-finite d stays in its window
        c0 = c1
    return [scores[b, E - e :] for b, (e, _) in enumerate(reads)]


def _mixed_cache(
    model: torch.nn.Module,
    flat: list[tuple[torch.Tensor, torch.Tensor]],
    r: torch.Tensor,
    ids: torch.Tensor,
    real: torch.Tensor,
    pos: torch.Tensor,
    first: torch.Tensor,
    stop: torch.Tensor,
    A: int,
):
    """The cache ``[C, heads, A, head_dim]`` that copy ``c``'s readout columns ``[A, E)`` attend to: the clean
    keys/values of row ``r[c]`` (``flat``: per layer ``[R * E, heads, head_dim]``, row-major), except columns
    ``[first[c], stop[c])`` (``stop <= A``), re-run on the copy ``ids[c]`` ``[E]``. Every copy re-runs the same
    number ``n`` of columns ``[s_c, s_c + n)`` ending at its ``stop`` (earlier columns are unchanged tokens) on its
    row's clean cache before ``s_c``, left-padded to a common length, so a chunk pays for no spread of window
    positions across rows."""
    dev = ids.device
    E = ids.shape[1]
    n = int((stop - first).clamp_min(0).max())
    base = (r * E)[:, None]
    mixed = [(k[base + torch.arange(A, device=dev)], v[base + torch.arange(A, device=dev)]) for k, v in flat]
    if n > 0:  # else every window lies in the readout columns
        start = (stop - n).clamp_min(0)  # [C]
        run = start[:, None] + torch.arange(n, device=dev)  # [C, n] the columns each copy re-runs
        P = int(start.max())
        before = start[:, None] - P + torch.arange(P, device=dev)  # [C, P] its clean columns before them, left-padded
        kept = (before >= 0) & real.gather(1, before.clamp_min(0))
        at = base + before.clamp_min(0)
        past = _cache([(k[at].transpose(1, 2), v[at].transpose(1, 2)) for k, v in flat] if P else [])
        rerun = model(ids.gather(1, run), attention_mask=torch.cat([kept, real.gather(1, run)], dim=1).long(),
                      position_ids=pos.gather(1, run).clamp_min(0), past_key_values=past, use_cache=True,
                      logits_to_keep=1).past_key_values
        valid = run < stop[:, None]  # the re-run columns before stop replace the clean ones
        c, j = valid.nonzero(as_tuple=True)
        for (k, v), (k_new, v_new) in zip(mixed, _layers(rerun), strict=True):
            k[c, run[c, j]] = k_new[:, :, P:].transpose(1, 2)[c, j]
            v[c, run[c, j]] = v_new[:, :, P:].transpose(1, 2)[c, j]
    return _cache([(k.transpose(1, 2), v.transpose(1, 2)) for k, v in mixed])


def _cache(layers: list[tuple[torch.Tensor, torch.Tensor]]):
    """A transformers ``DynamicCache`` holding ``(keys, values)`` per layer."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for layer, (k, v) in enumerate(layers):
        cache.update(k, v, layer)
    return cache


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
    horizon: int | None = None,
) -> torch.Tensor:
    """OAR-P importance of every reasoning token (exact unless ``horizon``; see the module docstring).

    Args:
        model: a Hugging Face causal LM (any dtype; the outcome is computed in float32).
        input_ids / attention_mask: ``[B, L]`` probes (any padding side).
        reasoning_mask / answer_mask: ``[B, L]`` bool; reasoning tokens must precede the answer.
        mode: ``"last"``, ``"answer_mean"`` or ``"answer_joint"``.
        replace_id: the counterfactual token; default the model config's pad id.
        chunk_size: perturbed copies per forward (bounds peak memory).
        span: extension, not in the paper. ``k`` replaces windows of k consecutive reasoning tokens at
            once, a ``[B, L]`` long tensor of window ids (e.g. :func:`line_segments`) replaces
            each window; every token of a window gets the window's score (k-fold fewer forwards).
        horizon: extension, not in the paper. ``W >= 0``: a copy re-runs only the ``W`` positions after its window
            (later positions keep their clean keys/values) and the answer-reading positions; None: exact.

    Returns:
        ``[B, L]`` float32 scores, 0 outside the reasoning and on rows without reasoning or answer.
    """
    check_inputs(input_ids, attention_mask, reasoning_mask, answer_mask, mode)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    _check_horizon(horizon)
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
                                       mode, replace_id, chunk_size, horizon)
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
    horizon: int | None = None,
) -> torch.Tensor:
    """The definition of OAR-P, written plainly: one full forward (full logits) per perturbed copy.

    Same arguments and result as :func:`perturbation_scores`; for tests and benchmarks only (cost:
    one forward of the whole probe per reasoning token, memory ``[L, V]`` per copy). With a ``horizon``, each
    copy's keys/values after ``W`` positions past its window are swapped for the clean ones and the positions
    from the first answer-predicting one are re-run on that cache.
    """
    check_inputs(input_ids, attention_mask, reasoning_mask, answer_mask, mode)
    _check_horizon(horizon)
    if horizon is not None:
        return _horizon_naive(model, input_ids, attention_mask, reasoning_mask, answer_mask, mode,
                              resolve_replace_id(model, replace_id), _segments(reasoning_mask, span), horizon)
    replace_id = resolve_replace_id(model, replace_id)
    segments = _segments(reasoning_mask, span)
    position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp_min(0)
    scores = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)

    def read(x: torch.Tensor, b: int) -> torch.Tensor:
        logits = model(x[None], attention_mask=attention_mask[b : b + 1],
                       position_ids=position_ids[b : b + 1]).logits[0].float()
        answer_pos = answer_mask[b].nonzero().squeeze(1)
        return _plain_outcome(logits[answer_pos - 1], x[answer_pos], mode)

    with torch.no_grad(), scoring_mode(model):
        for b in range(input_ids.shape[0]):
            if not (reasoning_mask[b].any() and answer_mask[b].any()):
                continue
            clean = read(input_ids[b], b)
            for w in segments[b][reasoning_mask[b]].unique():
                window = segments[b] == w
                scores[b, window] = _plain_shift(clean, read(input_ids[b].masked_fill(window, replace_id), b), mode)
    return scores


def _check_horizon(horizon: int | None) -> None:
    if horizon is not None and (isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 0):
        raise ValueError(f"horizon must be None or an int >= 0, got {horizon!r}")


def _horizon_naive(model, input_ids, attention_mask, reasoning_mask, answer_mask, mode, replace_id, segments,
                   horizon) -> torch.Tensor:
    """:func:`perturbation_scores_naive` with a horizon: per copy, a full forward of the unpadded row, its keys/values
    mixed with the clean ones, and the positions from the first answer-predicting one re-run on them."""
    from transformers import DynamicCache

    scores = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)

    def kv(x: torch.Tensor, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return _layers(model(x[None, :n], past_key_values=DynamicCache(), use_cache=True).past_key_values)

    def read(x: torch.Tensor, layers, answer: torch.Tensor) -> torch.Tensor:
        q0, stop = int(answer[0]) - 1, int(answer[-1])
        logits = model(x[None, q0:stop], position_ids=torch.arange(q0, stop, device=x.device)[None],
                       past_key_values=_cache([(k[:, :, :q0], v[:, :, :q0]) for k, v in layers]),
                       use_cache=True).logits[0].float()
        return _plain_outcome(logits[answer - 1 - q0], x[answer], mode)

    with torch.no_grad(), scoring_mode(model):
        for b in range(input_ids.shape[0]):
            if not (reasoning_mask[b].any() and answer_mask[b].any()):
                continue
            m = attention_mask[b].bool()
            x, seg, answer = input_ids[b][m], segments[b][m], answer_mask[b][m].nonzero().squeeze(1)
            n = int(answer[0]) - 1
            clean_kv = kv(x, n)
            clean = read(x, clean_kv, answer)
            columns = m.nonzero().squeeze(1)
            for w in seg[seg >= 0].unique():
                window = seg == w
                xp = x.masked_fill(window, replace_id)
                fresh = (torch.arange(n, device=x.device) <= int(window.nonzero().max()) + horizon)[:, None]
                mixed = [(torch.where(fresh, kp[0], kc[0])[None], torch.where(fresh, vp[0], vc[0])[None])
                         for (kp, vp), (kc, vc) in zip(kv(xp, n), clean_kv, strict=True)]
                scores[b, columns[window]] = _plain_shift(clean, read(xp, mixed, answer), mode)
    return scores


def _plain_outcome(logits: torch.Tensor, answer_ids: torch.Tensor, mode: str) -> torch.Tensor:
    """The outcome, written plainly, from the float32 logits ``[n, V]`` at the positions predicting the ``n`` answer
    tokens ``answer_ids``: log P_final ``[V]`` (``last``, ``answer_mean``) or φ (``answer_joint``)."""
    if mode == "last":
        return torch.log_softmax(logits[0], dim=-1)
    if mode == "answer_mean":
        return torch.log_softmax(logits.mean(dim=0), dim=-1)
    return torch.log_softmax(logits, dim=-1)[torch.arange(len(answer_ids)), answer_ids].mean()


def _plain_shift(clean: torch.Tensor, new: torch.Tensor, mode: str) -> torch.Tensor:
    """The score of one copy, written plainly: φ - φ' (``answer_joint``) or KL(P || P')."""
    return clean - new if mode == "answer_joint" else (clean.exp() * (clean - new)).sum()
