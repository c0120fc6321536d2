"""SC-GRPO: self-conditioned credit (Shan et al., "Learning from Own Solutions: Self-Conditioned Credit Assignment
for Reinforcement Learning with Verifiable Rewards", arXiv 2606.18810).

The policy conditioned on one of its own verified solutions of the same prompt (the *self-teacher*) predicts the
completion differently from the policy alone; the per-token KL between the two, read in one teacher-forced pass,
is the token's credit, a multiplicative weight on GRPO's advantage:

    KL_t = KL( π(· | x, y_<t) ‖ π(· | x, y*, x, y_<t) ),   w_t = KL_t / mean_s KL_s   (over the completion)

with ``y*`` a verified completion (reward >= ``min_reward``) of the same group other than ``y`` itself, placed in
the teacher's context as a first exchange (prompt, solution), followed by the prompt again. Only the abstract and
third-party summaries of the paper could be read here; every choice they leave open is ours (docs/credits.md,
"SC-GRPO"): the KL's direction, the context, which solution, the normalisation, and rows without a solution.
"""

from __future__ import annotations

import torch

from oar.credit.batch import CreditBatch
from oar.importance._common import scoring_mode
from oar.teacher_forcing import completion_hidden, head_kl, supports_fast_pass

SC_GRPO_PAPER = ("SC-GRPO, Learning from Own Solutions: Self-Conditioned Credit Assignment for RLVR, "
                 "arXiv 2606.18810")


def verified_donors(group: torch.Tensor, rewards: torch.Tensor, min_reward: float = 1.0) -> torch.Tensor:
    """``[B]`` long: for each row, the first other row of its group (batch order) whose reward is at least
    ``min_reward``; -1 where there is none. ``group`` / ``rewards``: ``[B]``."""
    B = group.shape[0]
    other = (group[:, None] == group[None, :]) & ~torch.eye(B, dtype=torch.bool, device=group.device)
    ok = other & (rewards >= min_reward)[None, :]
    return torch.where(ok.any(dim=1), ok.to(torch.uint8).argmax(dim=1), -1)


def _left_pad(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    mask = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long, device=device)
            mask[i, width - len(r):] = 1
    return ids, mask


def _completion_hidden(model, prefix: list[list[int]], completion: torch.Tensor,
                       completion_mask: torch.Tensor) -> torch.Tensor:
    """``[b, T, H]`` hidden states before the LM head at every completion position, after each row's ``prefix``
    (left-padded) and its completion (right-padded ``[b, T]``)."""
    p_ids, p_mask = _left_pad(prefix, completion.device)
    ids = torch.cat([p_ids, completion], dim=1)
    am = torch.cat([p_mask, completion_mask.long()], dim=1)
    return completion_hidden(model, ids, am, completion.shape[1], position_ids=(am.cumsum(dim=1) - 1).clamp_min(0))


def _completion_logp(model, prefix: list[list[int]], completion: torch.Tensor, completion_mask: torch.Tensor,
                     temperature: float) -> torch.Tensor:
    """``[b, T, V]`` float32 log-probs of the next token at every completion position (the path of a model whose
    head :func:`oar.teacher_forcing.supports_fast_pass` does not take)."""
    p_ids, p_mask = _left_pad(prefix, completion.device)
    ids = torch.cat([p_ids, completion], dim=1)
    am = torch.cat([p_mask, completion_mask.long()], dim=1)
    position_ids = (am.cumsum(dim=1) - 1).clamp_min(0)
    T = completion.shape[1]
    logits = model(ids, attention_mask=am, position_ids=position_ids, logits_to_keep=T + 1).logits[:, :-1]
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def _kl(model, student: list[list[int]], teacher: list[list[int]], comp: torch.Tensor, cm: torch.Tensor,
        temperature: float) -> torch.Tensor:
    """``[b, T]`` KL(policy after ``student`` || policy after ``teacher``) at every completion position (0 off
    ``cm``): with the LM head on the real completion positions only, in row chunks, for a plain causal LM."""
    if not supports_fast_pass(model):
        s, t = (_completion_logp(model, p, comp, cm, temperature) for p in (student, teacher))
        return (s.exp() * (s - t)).sum(dim=-1) * cm
    hs, ht = (_completion_hidden(model, p, comp, cm)[cm] for p in (student, teacher))
    kl = head_kl(hs, ht, model.get_output_embeddings().weight, temperature)
    return torch.zeros(cm.shape, dtype=torch.float32, device=comp.device).masked_scatter(cm, kl)


def sc_grpo_scores(batch: CreditBatch, active: torch.Tensor | None = None, batch_size: int = 16,
                   min_reward: float = 1.0, temperature: float = 1.0) -> torch.Tensor:
    """``[B, T]`` float32: the per-token KL between the policy and the policy conditioned on a verified solution of
    the row's group (module docstring); 0 on padding, inactive rows and rows whose group has no other verified
    completion. Two no-grad forwards of ``batch.model`` per ``batch_size`` rows (the completion after its prompt, and
    after prompt ⊕ solution ⊕ prompt); dropout off, modes restored."""
    cmask = batch.completion_mask.bool()
    B, T = batch.completion_ids.shape
    out = torch.zeros(B, T, dtype=torch.float32, device=batch.completion_ids.device)
    donors = verified_donors(batch.group, batch.rewards, min_reward)
    take = (donors >= 0) & cmask.any(dim=1)
    if active is not None:
        take &= active.bool()
    rows = take.nonzero().squeeze(1).tolist()
    prompts = [p[m.bool()].tolist() for p, m in zip(batch.prompt_ids, batch.prompt_mask, strict=True)]
    solutions = [c[m].tolist() for c, m in zip(batch.completion_ids, cmask, strict=True)]
    with torch.no_grad(), scoring_mode(batch.model):
        for i in range(0, len(rows), batch_size):
            idx = rows[i : i + batch_size]
            comp, cm = batch.completion_ids[idx], cmask[idx]
            kl = _kl(batch.model, [prompts[r] for r in idx],
                     [prompts[r] + solutions[int(donors[r])] + prompts[r] for r in idx], comp, cm, temperature)
            out[idx] = kl.clamp_min(0.0) * cm  # >= 0 up to rounding
    return out


def sc_grpo_weights(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` weights ``KL_t / mean KL`` over each row's masked tokens (masked mean 1: the advantage mass is
    kept); 1 off the mask and on rows whose KL is all 0 (no verified solution) or not finite."""
    n = mask.sum(dim=1, keepdim=True)
    kl = torch.where(mask, scores, 0.0)
    mean = kl.sum(dim=1, keepdim=True) / n.clamp_min(1)
    ok = (mean > 0) & torch.where(mask, torch.isfinite(scores), True).all(dim=1, keepdim=True) & mask
    return torch.where(ok, kl / torch.where(mean > 0, mean, torch.ones_like(mean)), torch.ones_like(scores))
