"""GRAIL: gradient-reweighted advantages (Pala, Toh, Poria, "GRAIL: Gradient-Reweighted Advantages for Reinforcement
Learning with Verifiable Rewards", arXiv 2606.04889).

The paper's method section could not be read here; its formula is recovered from the authors' official code
(github.com/declare-lab/grail, ``src/train/grail_trainer.py``, ``compute_grail_weights``; read, not copied) and its
README's default configuration (``qwen3_grail.yaml``). Per completion, teacher-forced on prompt ⊕ completion:

    J      = − Σ_{t ∈ answer} log π(y_t | ·) / temperature-scaled logits   (answer: the \\boxed{...} tokens)
    s_t    = ‖ ∂J/∂e_{t−1} ⊙ e_{t−1} ‖₂     (the input embedding at the position that predicts token t)
    z_t    = z-score of log(s_t + 1e-8) over the completion's tokens (population std, + 1e-8 under the root)
    w_t    = clip(mean + std · z_t, w_min, w_max)
    rows without a closed \\boxed{} answer, or of the sign ``symmetry`` leaves out: w = 1
    answer overrides (every row with an answer): the box's content w_max, its ``\\boxed{`` and ``}`` tokens ``mean``,
    every token after it ``mean``

and ``Â = A · w`` (mass not preserved). Defaults from the README's configuration: std 0.5, mean 1, w_min 0.5,
w_max 5, symmetry ``wrong`` (only failed completions reweighted), the input embeddings as the leaf. Every choice the
code makes that this project could have made otherwise is listed in docs/credits.md ("GRAIL").
"""

from __future__ import annotations

import torch

from oar.answer_span import locate_answer
from oar.credit.batch import CreditBatch
from oar.importance._common import outcome, readout_positions, scoring_mode
from oar.importance.gradient import _embedding_leaf
from oar.probe import _decode, _tokens_before

GRAIL_PAPER = ("GRAIL: Gradient-Reweighted Advantages for RLVR, arXiv 2606.04889 (formula from the authors' code, "
               "declare-lab/grail)")
SYMMETRIES = ("both", "correct", "wrong")  # which completions GRAIL reweights: all, successes, failures


def answer_parts(tokenizer, ids: list[int]) -> tuple[int, int, int] | None:
    """Token indices of a completion's last closed ``\\boxed{...}`` (:func:`oar.answer_span.locate_answer`):
    ``(start, content, close)``: the marker ``\\boxed{`` is tokens ``[start, content)``, its content ``[content,
    close)``, the closing brace token ``close``. None without a closed box."""
    text = _decode(tokenizer, ids)
    span = locate_answer(text, phrases=())
    if span is None or not span.boxed:
        return None
    inner = text.index("{", span.start) + 1
    brace = text.find("}", span.answer_end)
    start = _tokens_before(tokenizer, ids, span.start)[0]
    content = max(_tokens_before(tokenizer, ids, inner)[0], start)
    close = max(_tokens_before(tokenizer, ids, brace)[0], content)
    return (start, content, close) if close < len(ids) else None


def _saliency(model, ids: torch.Tensor, am: torch.Tensor, answer: torch.Tensor, temperature: float) -> torch.Tensor:
    """``[b, L]`` ‖∂J/∂e ⊙ e‖₂ per input column, J = − mean log-prob of the ``answer`` columns (its scale is one
    factor per row, which GRAIL's z-score of the log removes)."""
    position_ids = (am.long().cumsum(dim=1) - 1).clamp_min(0)
    keep, sel, targets = readout_positions(ids, answer, "answer_joint")
    with torch.inference_mode(False), torch.enable_grad(), _embedding_leaf(model.get_input_embeddings(), None) as leaf:
        logits = model(input_ids=ids, attention_mask=am, position_ids=position_ids, logits_to_keep=keep).logits
        objective = -outcome(logits.float() / temperature, sel, targets, "answer_joint")
        (grad,) = torch.autograd.grad(objective.sum(), leaf[-1])
    return (grad.float() * leaf[-1].detach().float()).norm(dim=-1)


def grail_scores(batch: CreditBatch, active: torch.Tensor | None = None, batch_size: int = 16, std: float = 0.5,
                 mean: float = 1.0, w_min: float = 0.5, w_max: float = 5.0, symmetry: str = "wrong",
                 temperature: float = 1.0) -> torch.Tensor:
    """``[B, T]`` float32: GRAIL's weight of every completion token (module docstring), 1 on padding, inactive
    rows and rows left uniform. The score is the weight itself (its effect is the identity): the answer overrides
    read the completion's text, which only the scoring side holds (``batch.tokenizer``).

    One forward and one backward to the input embeddings of ``batch.model`` per ``batch_size`` rows with an answer
    (no parameter gradient; dropout off, modes restored). The sign a ``symmetry`` reads: ``batch.advantages``, or
    each row's reward against its group's mean."""
    if symmetry not in SYMMETRIES:
        raise ValueError(f"symmetry must be one of {SYMMETRIES}, got {symmetry!r}")
    if batch.tokenizer is None:
        raise ValueError("credit 'grail' reads each completion's \\boxed{} answer: CreditBatch.tokenizer is None")
    cmask = batch.completion_mask.bool()
    B, T = batch.completion_ids.shape
    device = batch.completion_ids.device
    act = torch.ones(B, dtype=torch.bool, device=device) if active is None else active.bool().to(device)
    parts = {r: answer_parts(batch.tokenizer, batch.completion_ids[r][cmask[r]].tolist())
             for r in act.nonzero().squeeze(1).tolist()}
    found = torch.zeros(B, dtype=torch.bool, device=device)
    bounds = torch.zeros(B, 3, dtype=torch.long, device=device)
    for r, p in parts.items():
        if p is not None:
            found[r] = True
            bounds[r] = torch.tensor(p)
    col = torch.arange(T, device=device)[None, :]
    start, content, close = bounds[:, :1], bounds[:, 1:2], bounds[:, 2:]
    answer = found[:, None] & (col >= start) & (col <= close)
    saliency = torch.ones(B, T, dtype=torch.float32, device=device)
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    am = torch.cat([batch.prompt_mask.long(), batch.completion_mask.long()], dim=1)
    P = batch.prompt_ids.shape[1]
    with scoring_mode(batch.model):
        todo = found.nonzero().squeeze(1)
        for i in range(0, todo.numel(), batch_size):
            idx = todo[i : i + batch_size]
            answer_cols = torch.cat([torch.zeros_like(batch.prompt_mask[idx], dtype=torch.bool), answer[idx]], dim=1)
            s = _saliency(batch.model, ids[idx], am[idx], answer_cols, temperature)
            saliency[idx] = s[:, P - 1 : P - 1 + T]  # token t: the input that predicts it

    log_s = torch.log(saliency + 1e-8)
    m = cmask.to(log_s.dtype)
    n = m.sum(dim=1, keepdim=True).clamp_min(1.0)
    mu = (log_s * m).sum(dim=1, keepdim=True) / n
    sigma = torch.sqrt(((log_s - mu).square() * m).sum(dim=1, keepdim=True) / n + 1e-8)
    w = (mean + std * (log_s - mu) / sigma).clamp(w_min, w_max)
    sign = _signs(batch)
    left_out = (sign <= 0) if symmetry == "correct" else (sign > 0) if symmetry == "wrong" else torch.zeros_like(found)
    w = torch.where((found & ~left_out)[:, None], w, torch.ones_like(w))
    w = torch.where(found[:, None] & (col >= content) & (col < close), torch.full_like(w, w_max), w)
    w = torch.where(found[:, None] & (((col >= start) & (col < content)) | (col >= close)), torch.full_like(w, mean), w)
    return torch.where(cmask & act[:, None], w, torch.ones_like(w))


def _signs(batch: CreditBatch) -> torch.Tensor:
    """``[B]`` the sign of each row's sequence advantage: ``batch.advantages``, else the reward against its group's
    mean (what GRPO's advantage is the sign of)."""
    if batch.advantages is not None:
        return torch.sign(batch.advantages.float())
    if batch.rewards is None or batch.group is None:
        raise ValueError("credit 'grail' reads each completion's outcome: CreditBatch.advantages, or rewards and group")
    _, g = torch.unique(batch.group, return_inverse=True)
    r = batch.rewards.float()
    n = torch.zeros(int(g.max()) + 1, device=r.device).index_add_(0, g, torch.ones_like(r))
    mean = torch.zeros_like(n).index_add_(0, g, r) / n
    return torch.sign(r - mean[g])
