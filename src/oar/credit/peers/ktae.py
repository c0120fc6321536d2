"""KTAE: key-token advantages from rollout statistics (Sun et al., "KTAE: A Model-Free Algorithm to Key-Tokens
Advantage Estimation in Mathematical Reasoning", arXiv 2505.16826; official code xiaolizh1/KTAE, read, not copied).

Per group with at least one correct (reward > 0) and one wrong completion, for every token id v in it, the 2×2
table a, b (correct / wrong completions containing v), c, d (those not containing it) gives

    F  = exp(-2 p)   (p: two-sided Fisher exact test; F = 0 when p = 1)
    IG = H(Y) - H(Y | v ∈ o)          (bits)
    x  = asin√(a/(a+c)) - asin√(b/(b+d)) + tf_c/(tf_w + 1e-5) - tf_w/(tf_c + 1e-5)
    key(v) = 2·σ((α F + β IG) x / (α + β)) - 1          ∈ (-1, 1)

with BM25-style frequencies tf (k1 = 2, b = 0.5) of v in the correct / wrong completions. Every token o_{i,t} = v
of the group gets ``A_i + key(v)``: additive, the same sign in correct and wrong completions, no renormalisation.
Choices (docs/credits.md): p within 1e-6 of 1 counts as 1 (the official float32 test ``p != 1.0`` is not);
padding excluded, EOS not special-cased (the official code zeroes Qwen's EOS id only).
"""

from __future__ import annotations

import math

import torch

from oar.credit.batch import CreditBatch


def fisher_exact_p(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Two-sided Fisher exact p-values of 2×2 tables ``[[a, b], [c, d]]`` (``[N]`` each, float64): the sum of
    the hypergeometric probabilities of the tables with the same margins that are no more likely."""
    a, b, c, d = (x.double() for x in (a, b, c, d))
    row1, col1, n = a + b, a + c, a + b + c + d
    k = torch.arange(int(n.max().item()) + 1 if n.numel() else 1, dtype=torch.float64, device=a.device)[None, :]
    lo = (row1 + col1 - n).clamp_min(0)[:, None]
    hi = torch.minimum(row1, col1)[:, None]
    ok = (k >= lo) & (k <= hi)
    kk = k.expand(a.shape[0], -1)

    def lchoose(nn: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return torch.lgamma(nn + 1) - torch.lgamma(r + 1) - torch.lgamma(nn - r + 1)

    safe = torch.where(ok, kk, lo.expand_as(kk))
    logp = lchoose(col1[:, None], safe) + lchoose((n - col1)[:, None], row1[:, None] - safe) - lchoose(n[:, None],
                                                                                                      row1[:, None])
    pmf = torch.where(ok, logp.exp(), torch.zeros_like(logp))
    observed = (lchoose(col1, a) + lchoose(n - col1, b) - lchoose(n, row1)).exp()[:, None]
    return (pmf * (pmf <= observed * (1 + 1e-7))).sum(dim=1).clamp(max=1.0)


def _entropy2(p: torch.Tensor) -> torch.Tensor:
    q = 1 - p
    return -(torch.xlogy(p, p) + torch.xlogy(q, q)) / math.log(2)


def key_token_values(ids: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor, alpha: float = 1.0,
                     beta: float = 1.0, top: float = 1.0, k1: float = 2.0, b: float = 0.5) -> torch.Tensor:
    """``[G, T]`` KTAE key value of every token of one group (0 off ``mask``; all 0 unless the group has both
    outcomes).

    Args:
        ids: ``[G, T]`` completion token ids. mask: ``[G, T]`` bool. correct: ``[G]`` bool.
        alpha / beta: weights of the Fisher and information-gain terms. top: the key's bound.
        k1 / b: BM25 saturation and length normalisation.
    """
    G, T = ids.shape
    out = torch.zeros(G, T, dtype=torch.float64, device=ids.device)
    n_c, n_w = int(correct.sum()), int((~correct).sum())
    if n_c == 0 or n_w == 0:
        return out.float()
    vocab, inverse = torch.unique(ids[mask], return_inverse=True)
    tok = torch.zeros(G, T, dtype=torch.long, device=ids.device)
    tok[mask] = inverse
    occ = torch.zeros(G, vocab.numel(), dtype=torch.float64, device=ids.device)
    occ.index_put_((torch.arange(G, device=ids.device)[:, None].expand(G, T)[mask], tok[mask]),
                   torch.ones(int(mask.sum()), dtype=torch.float64, device=ids.device), accumulate=True)
    has = (occ > 0).double()
    cw = correct.double()[:, None]
    a, bb = (has * cw).sum(0), (has * (1 - cw)).sum(0)
    c, d = n_c - a, n_w - bb
    p = fisher_exact_p(a, bb, c, d)
    F = torch.where((p - 1).abs() < 1e-6, torch.zeros_like(p), torch.exp(-2 * p))
    n = float(G)
    h_y = _entropy2(torch.tensor(n_c / n, dtype=torch.float64))
    with_v, without_v = a + bb, c + d
    h_cond = (with_v / n) * _entropy2(a / with_v.clamp_min(1)) + (without_v / n) * _entropy2(c / without_v.clamp_min(1))
    ig = h_y - h_cond
    x = torch.asin(torch.sqrt(a / n_c)) - torch.asin(torch.sqrt(bb / n_w))
    lengths = mask.sum(dim=1).double()
    L_c, L_w = (lengths * cw[:, 0]).sum(), (lengths * (1 - cw[:, 0])).sum()
    avg = (L_c + L_w) / 2
    f_c, f_w = (occ * cw).sum(0) / L_c.clamp_min(1), (occ * (1 - cw)).sum(0) / L_w.clamp_min(1)
    K_c, K_w = k1 * (1 - b + b * L_c / avg), k1 * (1 - b + b * L_w / avg)
    tf_c, tf_w = f_c * (k1 + 1) / (f_c + K_c), f_w * (k1 + 1) / (f_w + K_w)
    x = x + tf_c / (tf_w + 1e-5) - tf_w / (tf_c + 1e-5)
    raw = (alpha * F + beta * ig) * x / (alpha + beta)
    key = (torch.sigmoid(raw) - 0.5) * 2 * top
    out[mask] = key[inverse]
    return out.float()


def ktae_scores(batch: CreditBatch, alpha: float = 1.0, beta: float = 1.0, top: float = 1.0) -> torch.Tensor:
    """``[B, T]`` key value of every completion token, group by group (``batch.group``, ``batch.rewards``)."""
    out = torch.zeros(batch.completion_ids.shape, dtype=torch.float32, device=batch.completion_ids.device)
    mask = batch.completion_mask.bool()
    correct = batch.rewards > 0
    for g in torch.unique(batch.group).tolist():  # a loop over groups, not tokens
        rows = (batch.group == g).nonzero().squeeze(1)
        out[rows] = key_token_values(batch.completion_ids[rows], mask[rows], correct[rows], alpha, beta, top)
    return out
