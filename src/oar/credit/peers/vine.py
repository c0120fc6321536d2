"""VinePPO / SPO: Monte-Carlo step values from resampled continuations (Kazemnejad et al., "VinePPO: Refining
Credit Assignment in RL Training of LLMs", arXiv 2410.01679; Guo et al., "Segment Policy Optimization", arXiv
2505.23564).

A completion is cut into steps at the matches of a separator regex. For every state s_k (the prompt plus the
completion up to boundary k; s_0 is the prompt alone) the policy samples K continuations, the reward grades them,
and V(s_k) is their mean reward; the final state's value is the completion's own reward R. Step k (the tokens
from boundary k to boundary k+1) gets

    ΔV_k = V(s_{k+1}) - V(s_k)      (no discount, no intermediate reward; Σ_k ΔV_k = R - V(s_0))

``vine`` uses ΔV_k as the token advantage of every token of step k (``replace``); ``vine-w`` keeps GRPO's sequence
advantage A and spreads it over the steps with mass-preserving weights w ∝ max(sign(A)·ΔV_k, 0) + eps, mean 1 over
the completion (``multiply``). Choices the papers leave open, and ours, are listed in docs/credits.md.

The method needs what generates and grades: :class:`Continuations`, handed in as ``CreditBatch.rollout`` (the
TRL trainer builds one from its policy and reward functions, :mod:`oar.trl_rollout`).
"""

from __future__ import annotations

import re
from typing import Protocol, runtime_checkable

import torch

from oar.credit.batch import CreditBatch

SEPARATOR = r"; |\n+"
PASSES = ("K continuations (generation) from the prompt and from each of ≤ max_steps step boundaries per "
          "completion (equal states once), each graded by the reward")
VINE_PAPER = "VinePPO, arXiv 2410.01679; SPO (segment MC advantages), arXiv 2505.23564"


@runtime_checkable
class Continuations(Protocol):
    """What ``vine`` needs to generate and grade: the policy's sampler and the task's reward, per batch row."""

    def decode(self, ids: list[list[int]]) -> list[str]:
        """The texts of completion token ids (as the reward sees them: special tokens dropped)."""

    def sample(self, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor, prefix_lengths: torch.Tensor,
               num_samples: int, temperature: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``num_samples`` continuations of each left-padded prefix (prompt + completion prefix, ``[N, P]``;
        ``prefix_lengths [N]``: the completion tokens already in it). Returns ``(ids, mask)`` ``[N·K, L]``,
        prefix-major (rows n·K .. n·K+K-1 continue prefix n), right-padded; a continuation stops at EOS
        (kept) or at the completion length limit. ``temperature`` None: the rollout's own."""

    def reward(self, rows: torch.Tensor, completion_ids: list[list[int]]) -> torch.Tensor:
        """``[M]`` float rewards of full completions (``completion_ids[m]`` answers the prompt of batch row
        ``rows[m]``, graded with that row's dataset columns)."""

    def keys(self) -> torch.Tensor:
        """``[B]`` long: rows with equal keys have the same prompt and are graded alike (their equal prefixes
        are one state, sampled once)."""

    def rows(self, idx: torch.Tensor) -> Continuations:
        """The rollout restricted to batch rows ``idx`` (what :meth:`CreditBatch.rows` calls)."""


class RowView:
    """A :class:`Continuations` restricted to batch rows ``idx [n]`` (row ``i`` of the view is ``idx[i]`` of
    ``base``): the ``rows`` method of an implementation can return one."""

    def __init__(self, base: Continuations, idx: torch.Tensor) -> None:
        self.base, self.idx = base, idx.long()

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.base.decode(ids)

    def sample(self, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor, prefix_lengths: torch.Tensor,
               num_samples: int, temperature: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.base.sample(prefix_ids, prefix_mask, prefix_lengths, num_samples, temperature)

    def reward(self, rows: torch.Tensor, completion_ids: list[list[int]]) -> torch.Tensor:
        return self.base.reward(self.idx.to(rows.device)[rows], completion_ids)

    def keys(self) -> torch.Tensor:
        return self.base.keys()[self.idx.to(self.base.keys().device)]

    def rows(self, idx: torch.Tensor) -> RowView:
        return RowView(self.base, self.idx[idx.to(self.idx.device)])

    def note_cost(self, **cost: int) -> None:
        note = getattr(self.base, "note_cost", None)
        if note is not None:
            note(**cost)


def _cumulative_lengths(rollout: Continuations, ids: list[list[int]], texts: list[str]) -> list[list[int] | None]:
    """Per row, ``ends[j]`` = the length of the text of its first ``j + 1`` tokens, from one decode of every token
    on its own; None for a row whose pieces do not add up to its text (a tokenizer that strips a leading space or
    splits a character): :func:`_token_positions` bisects on decoded prefixes there."""
    pieces = rollout.decode([[t] for row in ids for t in row]) if any(ids) else []
    out: list[list[int] | None] = []
    start = 0
    for row, text in zip(ids, texts, strict=True):
        ends = torch.tensor([len(p) for p in pieces[start : start + len(row)]], dtype=torch.long).cumsum(0).tolist()
        start += len(row)
        out.append(ends if (ends[-1] if ends else 0) == len(text) else None)
    return out


def _token_positions(rollout: Continuations, ids: list[list[int]], char_ends: list[list[int]],
                     cum: list[list[int] | None]) -> list[list[int]]:
    """For each row and char offset ``e``, the fewest tokens whose text reaches ``e`` (smallest ``j`` with
    ``len(text(row[:j])) >= e``)."""
    out: list[list[int]] = []
    slow: list[tuple[int, int]] = []  # (row, index into char_ends[row])
    for i, ends in enumerate(char_ends):
        if cum[i] is not None:
            c = torch.tensor(cum[i], dtype=torch.long)
            out.append((torch.searchsorted(c, torch.tensor(ends, dtype=torch.long), side="left") + 1).tolist())
        else:
            out.append([0] * len(ends))
            slow += [(i, m) for m in range(len(ends))]
    if slow:  # batched bisection over every unresolved boundary: lo < answer <= hi
        lo = [0] * len(slow)
        hi = [len(ids[i]) for i, _ in slow]
        while any(h - lo_ > 1 for lo_, h in zip(lo, hi, strict=True)):
            mids = [(a + b) // 2 for a, b in zip(lo, hi, strict=True)]
            texts = rollout.decode([ids[i][:mid] for (i, _), mid in zip(slow, mids, strict=True)])
            for n, ((i, m), mid, t) in enumerate(zip(slow, mids, texts, strict=True)):
                if hi[n] - lo[n] <= 1:
                    continue
                if len(t) >= char_ends[i][m]:
                    hi[n] = mid
                else:
                    lo[n] = mid
        for ((i, m), h) in zip(slow, hi, strict=True):
            out[i][m] = h
    return out


def step_boundaries(rollout: Continuations, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                    rows: torch.Tensor, separator: str = SEPARATOR, max_steps: int = 8) -> list[list[int]]:
    """Per row of ``rows``, the sorted token positions ``0 < j < n`` where a new step starts: just after each
    match of ``separator`` in the completion's text (a token straddling a match end belongs to the step before).
    More than ``max_steps`` boundaries: ``max_steps`` of them, evenly spaced over the matches."""
    pattern = re.compile(separator)
    lengths = completion_mask.bool().sum(dim=1)
    ids = [completion_ids[i, : int(lengths[i])].tolist() for i in rows.tolist()]
    texts = rollout.decode(ids)
    char_ends = [[m.end() for m in pattern.finditer(t) if 0 < m.end() < len(t)] for t in texts]
    cum = _cumulative_lengths(rollout, ids, texts)
    out = []
    for row_ids, js in zip(ids, _token_positions(rollout, ids, char_ends, cum), strict=True):
        js = sorted({j for j in js if 0 < j < len(row_ids)})
        if len(js) > max_steps:
            pick = torch.linspace(0, len(js) - 1, max_steps).round().long().unique().tolist()
            js = [js[p] for p in pick]
        out.append(js)
    return out


def _prefixes(batch: CreditBatch, rows: torch.Tensor, cuts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, L]`` left-padded ``prompt + completion[:cut]`` of batch rows ``rows [N]`` (``cuts [N]``), and its mask."""
    P, T = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
    ids = torch.cat([batch.prompt_ids[rows], batch.completion_ids[rows]], dim=1)
    keep = torch.cat([batch.prompt_mask[rows].bool(),
                      torch.arange(T, device=ids.device)[None, :] < cuts[:, None]], dim=1)
    order = torch.argsort(keep.to(torch.int8), dim=1, stable=True)  # dropped first, kept tokens in order last
    ids, keep = ids.gather(1, order), keep.gather(1, order)
    width = int(keep.sum(dim=1).max()) if keep.numel() else 0
    ids, keep = ids[:, P + T - width :], keep[:, P + T - width :]
    return ids.masked_fill(~keep, 0), keep.long()


def mc_values(batch: CreditBatch, rows: torch.Tensor, cuts: torch.Tensor, k: int, temperature: float | None,
              prefixes_per_call: int) -> tuple[torch.Tensor, dict[str, int]]:
    """``[N]`` Monte-Carlo values of the states (batch row ``rows[n]``, completion cut at ``cuts[n]`` tokens):
    the mean reward of ``k`` continuations. Equal states (same rollout key and prefix) are sampled once.
    Also returns the cost: ``states`` sampled, continuation ``tokens`` generated, completions ``graded``."""
    rollout = batch.rollout
    device = batch.completion_ids.device
    ids, mask = _prefixes(batch, rows, cuts)
    state = torch.cat([rollout.keys().to(device)[rows, None], ids * mask, mask], dim=1)
    uniq, inverse = torch.unique(state, dim=0, return_inverse=True)
    first = torch.full((uniq.shape[0],), rows.numel(), dtype=torch.long, device=device)
    first = first.scatter_reduce(0, inverse, torch.arange(rows.numel(), device=device), reduce="amin")
    order = first[torch.argsort(cuts[first] + mask[first].sum(1), stable=True)]  # similar lengths share a call
    values = torch.zeros(uniq.shape[0], dtype=torch.float32, device=device)
    cost = {"states": int(uniq.shape[0]), "tokens": 0, "graded": 0}
    for s in range(0, order.numel(), prefixes_per_call):
        pick = order[s : s + prefixes_per_call]
        p_ids, p_mask = ids[pick], mask[pick]
        width = int(p_mask.sum(1).max())
        cont, cont_mask = rollout.sample(p_ids[:, -width:], p_mask[:, -width:], cuts[pick], k, temperature)
        cont_mask = cont_mask.bool()
        cost["tokens"] += int(cont_mask.sum())
        owner = pick.repeat_interleave(k)
        full = [batch.completion_ids[rows[o], : int(cuts[o])].tolist() + c[m].tolist()
                for o, c, m in zip(owner.tolist(), cont, cont_mask, strict=True)]
        r = torch.as_tensor(rollout.reward(rows[owner], full), dtype=torch.float32).to(device)
        cost["graded"] += len(full)
        values[inverse[pick]] = torch.nan_to_num(r, nan=0.0).view(-1, k).mean(dim=1)
    return values[inverse], cost


def step_advantages(batch: CreditBatch, rows: torch.Tensor, boundaries: list[list[int]], k: int = 4,
                    temperature: float | None = None, prefixes_per_call: int = 64) -> tuple[torch.Tensor, dict]:
    """``[n, T]`` ΔV of the step each completion token of ``rows [n]`` belongs to (0 off the completion), from
    MC values of the prompt and of every boundary in ``boundaries`` (per row), the last value being the row's
    reward (``batch.rewards``; graded by the rollout when None). Also returns the cost (:func:`mc_values`)."""
    device = batch.completion_ids.device
    T = batch.completion_ids.shape[1]
    n = rows.numel()
    S = max((len(b) for b in boundaries), default=0)
    cut = torch.full((n, S + 1), -1, dtype=torch.long)
    for i, b in enumerate(boundaries):
        cut[i, : len(b) + 1] = torch.tensor([0, *b], dtype=torch.long)
    cut = cut.to(device)
    valid = cut >= 0
    rr, ss = valid.nonzero(as_tuple=True)
    v, cost = mc_values(batch, rows[rr], cut[rr, ss], k, temperature, prefixes_per_call)
    lengths = batch.completion_mask[rows].bool().sum(dim=1)
    if batch.rewards is not None:
        final = batch.rewards[rows].float().to(device)
    else:
        final = torch.as_tensor(batch.rollout.reward(
            rows, [batch.completion_ids[i, : int(lengths[j])].tolist() for j, i in enumerate(rows.tolist())]),
            dtype=torch.float32).to(device)
        cost["graded"] += n
    values = torch.zeros(n, S + 2, dtype=torch.float32, device=device)
    values[rr, ss] = v
    n_steps = valid.sum(dim=1)  # boundaries + 1
    values[torch.arange(n, device=device), n_steps] = torch.nan_to_num(final, nan=0.0)  # TRL: NaN rewards sum to 0
    delta = values[:, 1:] - values[:, :-1]  # [n, S + 1]; entries past a row's last step are unused
    starts = torch.where(valid[:, 1:], cut[:, 1:], torch.full_like(cut[:, 1:], T + 1))  # [n, S]
    step = (torch.arange(T, device=device)[None, :, None] >= starts[:, None, :]).sum(dim=2)  # [n, T]
    out = delta.gather(1, step)
    return out.masked_fill(~batch.completion_mask[rows].bool(), 0.0), cost


def vine_scores(batch: CreditBatch, active: torch.Tensor | None = None, separator: str = SEPARATOR,
                max_steps: int = 8, k: int = 4, temperature: float | None = None,
                prefixes_per_call: int = 64) -> torch.Tensor:
    """``[B, T]`` ΔV of each token's step (rows in ``active``; 0 elsewhere). ``batch.rollout`` generates and grades
    (the method is registered ``needs_rollout``, so :func:`oar.credit.token_credit` checks it is there)."""
    B, T = batch.completion_ids.shape
    out = torch.zeros(B, T, dtype=torch.float32, device=batch.completion_ids.device)
    rows = torch.arange(B, device=out.device) if active is None else active.nonzero().squeeze(1)
    if not rows.numel():
        return out
    bounds = step_boundaries(batch.rollout, batch.completion_ids, batch.completion_mask, rows, separator, max_steps)
    out[rows], cost = step_advantages(batch, rows, bounds, k, temperature, prefixes_per_call)
    note = getattr(batch.rollout, "note_cost", None)
    if note is not None:
        note(**cost, steps=sum(len(b) + 1 for b in bounds), rows=int(rows.numel()))
    return out


def replace_effect(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``vine``'s effect: ΔV is the token advantage itself."""
    return scores


def step_weights(delta: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, eps: float = 0.05) -> torch.Tensor:
    """``[B, T]`` mass-preserving step weights: ``max(sign(A)·ΔV, 0) + eps``, divided by its mean over each row's
    masked tokens (so the masked mean is 1); rows with ``A = 0`` or no masked token get 1."""
    raw = (torch.sign(advantages)[:, None] * delta).clamp_min(0.0) + eps
    m = mask.float()
    mean = (raw * m).sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True).clamp_min(1.0)
    w = raw / mean
    keep = mask & (advantages != 0)[:, None]
    return torch.where(keep, w, torch.ones_like(w))


def weight_effect(scores: torch.Tensor, mask: torch.Tensor, batch: CreditBatch, eps: float = 0.05) -> torch.Tensor:
    """``vine-w``'s effect: :func:`step_weights` of ΔV with the batch's sequence advantages."""
    return step_weights(scores, mask, batch.advantages.to(scores.device), eps)
