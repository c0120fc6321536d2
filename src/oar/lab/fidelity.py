"""Attribution fidelity on the lab: does a scorer rank the tokens the answer depends on above filler?"""

from __future__ import annotations

import torch

from oar.lab.task import FILLER, PIVOTAL, STRUCTURE, LabProblem
from oar.reshape import bilevel_weights

FIDELITY_SCORERS = ("oar-p", "oar-g", "entropy", "random")
LABEL_NAMES = {PIVOTAL: "pivotal", STRUCTURE: "structure", FILLER: "filler"}


def pairwise_auc(scores: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """Per-row ROC AUC (Mann-Whitney U / (n+ n-), ties count 1/2) of ``positive`` vs ``negative`` entries.

    Args:
        scores: ``[B, T]`` floats. positive / negative: ``[B, T]`` bool, disjoint.

    Returns:
        ``[B]`` AUC in [0, 1]; NaN for rows lacking positives or negatives.
    """
    diff = scores[:, :, None] - scores[:, None, :]  # [B, T(pos), T(neg)]
    win = (diff > 0).float() + 0.5 * (diff == 0).float()
    pair = positive[:, :, None] & negative[:, None, :]
    n = pair.sum(dim=(1, 2))
    auc = (win * pair).sum(dim=(1, 2)) / n.clamp_min(1)
    return auc.masked_fill(n == 0, float("nan"))


def lab_batch(tokenizer, problems: list[LabProblem]) -> dict[str, torch.Tensor]:
    """Rollout-layout tensors of the worked solutions: left-padded ``prompt_ids/prompt_mask [B, P]``,
    right-padded ``completion_ids/completion_mask [B, T]`` (completion + eos) and ``labels [B, T]``
    (task label per token, -1 on eos and padding)."""
    enc = tokenizer([p.prompt for p in problems], return_tensors="pt", padding=True)
    rows = [tokenizer(p.completion)["input_ids"] + [tokenizer.eos_token_id] for p in problems]
    T = max(map(len, rows))
    ids = torch.full((len(rows), T), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), T), -1, dtype=torch.long)
    for i, (r, p) in enumerate(zip(rows, problems, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(p.labels)] = torch.tensor(p.labels)
    mask = torch.arange(T)[None, :] < torch.tensor([len(r) for r in rows])[:, None]
    return {"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"].bool(),
            "completion_ids": ids, "completion_mask": mask, "labels": labels}


def attribution_fidelity(
    model, tokenizer, problems: list[LabProblem], scorers: tuple[str, ...] = FIDELITY_SCORERS,
    conclude: str = "\\boxed{", batch_size: int = 32, seed: int = 0,
) -> dict[str, dict[str, float]]:
    """AUC of each scorer for ranking pivotal reasoning tokens (operands, intermediate results) above
    answer-irrelevant filler, on the worked solutions of ``problems`` scored by ``model``.

    Returns ``{scorer: {"auc_filler": mean AUC pivotal-vs-filler, "auc_rest": mean AUC pivotal-vs-every other
    reasoning token, "completions": rows averaged, "weight_pivotal" / "weight_structure" / "weight_filler": mean
    Bi-Level weight (``bilevel_weights`` defaults) of the reasoning tokens with that label}}``; AUC 0.5 is chance,
    1.0 a perfect ranking; a mean weight above 1 means that kind of token gets more than its uniform share of the
    advantage.
    """
    from oar.importance import get_scorer
    from oar.probe import OutcomeProbe

    if not problems:
        raise ValueError("problems is empty")
    probe = OutcomeProbe(tokenizer, conclude=conclude)
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, dict[str, list[torch.Tensor]]] = {
        s: {"auc_filler": [], "auc_rest": [], **{f"weights_{n}": [] for n in LABEL_NAMES.values()}} for s in scorers
    }
    model.eval()
    for i in range(0, len(problems), batch_size):
        b = lab_batch(tokenizer, problems[i : i + batch_size])
        pb = probe(b["prompt_ids"], b["prompt_mask"], b["completion_ids"], b["completion_mask"])
        reasoning = pb.completion_reasoning_mask & pb.valid[:, None]
        pos = reasoning & (b["labels"] == PIVOTAL)
        for name in scorers:
            kw = {"generator": gen} if name in ("oar-g", "random") else {}
            scores = get_scorer(name)(model, pb.input_ids, pb.attention_mask, pb.reasoning_mask,
                                      pb.answer_mask, **kw).detach()
            comp = pb.to_completion(scores.float())
            out[name]["auc_filler"].append(pairwise_auc(comp, pos, reasoning & (b["labels"] == FILLER)))
            out[name]["auc_rest"].append(pairwise_auc(comp, pos, reasoning & ~pos))
            weights = bilevel_weights(comp, reasoning)
            for label, n in LABEL_NAMES.items():
                out[name][f"weights_{n}"].append(weights[reasoning & (b["labels"] == label)])
    result = {}
    for name, d in out.items():
        f, r = torch.cat(d["auc_filler"]), torch.cat(d["auc_rest"])
        result[name] = {"auc_filler": f.nanmean().item(), "auc_rest": r.nanmean().item(),
                        "completions": int((~r.isnan()).sum()),
                        **{f"weight_{n}": torch.cat(d[f"weights_{n}"]).mean().item() for n in LABEL_NAMES.values()}}
    return result
