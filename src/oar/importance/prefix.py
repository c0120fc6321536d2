"""OAR-prefix (extension of OAR, not in the paper): a step's importance is how much the answer moves across it when
the probe sees only the reasoning written so far.

OAR's probe (OAR_SPEC §2) keeps the whole written reasoning before the conclude text, so the last written result
screens every earlier step off the answer: perturbing step 3 of 8 barely moves an answer that step 8 states.
OAR-prefix reads the answer after each step boundary instead: ``φ_k`` = the mean log-probability of the answer
tokens given the prompt, the reasoning up to the end of step ``k`` and the probe's conclude text (``φ_0``: no
reasoning; the last ``φ`` is the full probe's). Every token of step ``k`` scores ``|φ_k − φ_{k−1}|``, and OAR's
Bi-Level reshaping turns the scores into weights as for ``oar-g``.

A step ends at a reasoning token whose text matches ``separator`` (the lab's ``;``, a newline for real math); the
boundary ids come from the probe's tokenizer or are given (:mod:`oar.steps`, the one home of the step boundaries,
which the ``step`` and ``process`` reshaping rules read too). Exact and batched: one clean pass
over the probes keeps their key/value cache; then every (row, boundary) copy runs only the row's tail (conclude text
and answer, a handful of tokens) on that cache with the columns after its boundary masked out, ``chunk_size`` copies
per forward, the LM head only at the answer-predicting positions. Exact for full-attention models (a sliding window
would count the masked columns).
"""

from __future__ import annotations

import torch

from oar.importance._common import check_inputs, outcome, readout_positions, scoring_mode
from oar.steps import SEPARATOR, separator_ids, step_ids


def prefix_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    reasoning_mask: torch.Tensor,
    answer_mask: torch.Tensor,
    separator: str = SEPARATOR,
    boundary_ids: list[int] | tuple[int, ...] | None = None,
    chunk_size: int = 64,
    probe=None,
) -> torch.Tensor:
    """OAR-prefix importance ``[B, L]`` float32 of every reasoning token (0 elsewhere; see the module docstring).

    Args:
        model: a Hugging Face causal LM with full attention. input_ids / attention_mask / reasoning_mask /
            answer_mask: ``[B, L]`` outcome probes (any padding side).
        separator: regex on a token's text that ends a step, resolved through ``probe.tokenizer``.
        boundary_ids: the step-ending token ids themselves (instead of ``separator`` and a probe).
        chunk_size: (row, boundary) copies per forward pass, >= 1.
        probe: the :class:`oar.probe.OutcomeProbe` (handed by :func:`oar.credit.token_credit`), for its tokenizer.
    """
    check_inputs(input_ids, attention_mask, reasoning_mask, answer_mask, "answer_joint")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if boundary_ids is None:
        if probe is None:
            raise ValueError("oar-prefix needs boundary_ids or a probe whose tokenizer resolves separator")
        boundary_ids = separator_ids(probe.tokenizer, separator)
    device = input_ids.device
    B, L = input_ids.shape
    scores = torch.zeros(B, L, dtype=torch.float32, device=device)
    rows = (reasoning_mask.any(dim=1) & answer_mask.any(dim=1)).nonzero().squeeze(1)
    if rows.numel() == 0:
        return scores
    with torch.no_grad(), scoring_mode(model):
        scores[rows] = _scores(model, input_ids[rows], attention_mask[rows].bool(), reasoning_mask[rows],
                               answer_mask[rows], torch.tensor(list(boundary_ids), device=device), chunk_size)
    return scores


def _scores(model, ids: torch.Tensor, real: torch.Tensor, reasoning: torch.Tensor, answer: torch.Tensor,
            ends: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """The scores of rows that all have reasoning and an answer (``real``: the attention mask as bool)."""
    from transformers import DynamicCache

    from oar.importance.perturbation import _cache, _layers

    R, L = ids.shape
    device = ids.device
    col = torch.arange(L, device=device)
    pos = (real.long().cumsum(dim=1) - 1).clamp_min(0)
    keep, sel, targets = readout_positions(ids, answer, "answer_joint")
    out = model(ids, attention_mask=real.long(), position_ids=pos, past_key_values=DynamicCache(), use_cache=True,
                logits_to_keep=keep)
    clean, kv = outcome(out.logits, sel, targets, "answer_joint"), _layers(out.past_key_values)  # [R]

    # the tail each copy re-runs: from the column after the last reasoning token to the last answer-predicting one
    last_reasoning = torch.where(reasoning, col, -1).amax(dim=1)
    last_read = torch.where(answer, col, -1).amax(dim=1) - 1
    tail_start, S = last_reasoning + 1, int((last_read - last_reasoning).max())
    tcol = (tail_start[:, None] + torch.arange(S, device=device)).clamp_max(L - 1)  # [R, S] columns of the tail
    tail_ids, tail_next = ids.gather(1, tcol), ids.gather(1, (tcol + 1).clamp_max(L - 1))
    tail_sel = answer.gather(1, (tcol + 1).clamp_max(L - 1)) & (tcol < last_read[:, None] + 1)

    # one copy per (row, step) whose end is not the last reasoning token, plus one per row with no reasoning at all
    step = step_ids(ids, reasoning, ends)
    n_steps = step.amax(dim=1) + 1  # [R]
    step_end = torch.full((R, L), -1, dtype=torch.long, device=device)  # [R, max steps] last column of each step
    step_end.scatter_reduce_(1, step.clamp_min(0), torch.where(reasoning, col, -1).expand(R, L), reduce="amax")
    first_reasoning = torch.where(reasoning, col, L).amin(dim=1)
    k = torch.arange(L, device=device)
    # cut c (exclusive) after step j-1 for j = 0..n-1: c_0 = first reasoning column, c_j = step_end[j-1] + 1
    cuts = torch.where(k[None, :] == 0, first_reasoning[:, None], step_end.roll(1, dims=1) + 1)
    need = k[None, :] < n_steps[:, None]  # phi before step j, for every step j (after the last: the clean phi)
    row, j = need.nonzero(as_tuple=True)
    cut = cuts[row, j]
    phi_before = torch.zeros(R, L, dtype=torch.float32, device=device)
    for c0 in range(0, row.numel(), chunk_size):
        r, c = row[c0 : c0 + chunk_size], cut[c0 : c0 + chunk_size]
        past = _cache([(keys[r], values[r]) for keys, values in kv])
        mask = torch.cat([real[r] & (col[None, :] < c[:, None]), torch.ones(r.numel(), S, dtype=torch.bool,
                                                                               device=device)], dim=1)
        start = (real[r] & (col[None, :] < c[:, None])).sum(dim=1)  # the tail's first position id
        logits = model(tail_ids[r], attention_mask=mask.long(), past_key_values=past, use_cache=True,
                       position_ids=start[:, None] + torch.arange(S, device=device)).logits
        phi_before[r, j[c0 : c0 + chunk_size]] = outcome(logits, tail_sel[r], tail_next[r], "answer_joint")
    phi_after = torch.where(k[None, :] + 1 < n_steps[:, None], phi_before.roll(-1, dims=1), clean[:, None])
    delta = (phi_after - phi_before).abs()  # [R, steps]
    return torch.where(reasoning, delta.gather(1, step.clamp_min(0)), 0.0)


def prefix_scores_naive(model, input_ids, attention_mask, reasoning_mask, answer_mask,
                        boundary_ids: list[int] | tuple[int, ...]) -> torch.Tensor:
    """The definition written plainly (one full forward per truncated probe, no cache): the test oracle."""
    check_inputs(input_ids, attention_mask, reasoning_mask, answer_mask, "answer_joint")
    ends = torch.tensor(list(boundary_ids), device=input_ids.device)
    scores = torch.zeros(input_ids.shape, dtype=torch.float32)
    with torch.no_grad(), scoring_mode(model):
        for b in range(input_ids.shape[0]):
            real = attention_mask[b].bool()
            ids, rm, am = input_ids[b][real], reasoning_mask[b][real], answer_mask[b][real]
            if not rm.any() or not am.any():
                continue
            cols = rm.nonzero().squeeze(1)
            head, tail = ids[: int(cols[0])], ids[int(cols[-1]) + 1 :]
            tail_answer = am[int(cols[-1]) + 1 :]
            reasoning_ids = ids[cols]
            cut_after = [i + 1 for i, t in enumerate(reasoning_ids.tolist()) if t in set(ends.tolist())]
            cuts = [0] + [c for c in cut_after if c < len(reasoning_ids)] + [len(reasoning_ids)]

            values = []
            for n in cuts:  # the answer's mean log-probability with the reasoning cut after n tokens
                x = torch.cat([head, reasoning_ids[:n], tail])[None]
                logp = torch.log_softmax(model(x).logits[0].float(), dim=-1)
                a = len(head) + n + tail_answer.nonzero().squeeze(1)
                values.append(float(logp[a - 1, x[0, a]].mean()))
            full = torch.zeros(len(reasoning_ids))
            for s in range(len(cuts) - 1):
                full[cuts[s] : cuts[s + 1]] = abs(values[s + 1] - values[s])
            scores[b, real.nonzero().squeeze(1)[cols]] = full
    return scores.to(input_ids.device)
