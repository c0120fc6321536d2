"""Attribution fidelity on the lab: does a scorer rank the tokens the answer depends on above filler?"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from oar.lab.task import ANSWER, BOXED, DISTRACTOR, FILLER, LABEL_NAMES, PIVOTAL, LabProblem, steps_from_end

# every method with a per-token signal of its own (group-statistics methods have none on worked solutions)
FIDELITY_SCORERS = ("oar-p", "oar-g", "entropy", "random", "entropy-mask", "cf-span", "shuffle:oar-g",
                    "inverted:oar-g")
REASONING_KINDS = {k: n for k, n in LABEL_NAMES.items() if k != ANSWER}  # the kinds of reasoning token


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


def lab_batch(tokenizer, problems: list[LabProblem]) -> dict:
    """Rollout-layout tensors of the worked solutions: left-padded ``prompt_ids/prompt_mask [B, P]`` (the lab
    prompt, in the tokenizer's chat template when it has one: the LM lab), right-padded
    ``completion_ids/completion_mask [B, T]`` (completion + eos), ``labels [B, T]`` (task label per token from
    the labels of the characters it covers, :func:`oar.lab.lm.token_labels`; -1 on eos and padding) and
    ``offsets`` (each row's token ``[start, end)`` character spans in its completion)."""
    from oar.lab.lm import chat_prompt, token_labels

    chat = getattr(tokenizer, "chat_template", None) is not None
    prompts = [chat_prompt(tokenizer, p.prompt) if chat else p.prompt for p in problems]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    comps = [tokenizer(p.completion, add_special_tokens=False, return_offsets_mapping=True) for p in problems]
    rows = [c["input_ids"] + [tokenizer.eos_token_id] for c in comps]
    T = max(map(len, rows))
    ids = torch.full((len(rows), T), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), T), -1, dtype=torch.long)
    for i, (r, c, p) in enumerate(zip(rows, comps, problems, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(r) - 1] = torch.tensor(token_labels(c["offset_mapping"], p.labels), dtype=torch.long)
    mask = torch.arange(T)[None, :] < torch.tensor([len(r) for r in rows])[:, None]
    return {"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"].bool(),
            "completion_ids": ids, "completion_mask": mask, "labels": labels,
            "offsets": [[tuple(o) for o in c["offset_mapping"]] for c in comps]}


def _columns(scorers: tuple[str, ...], what: str) -> list[tuple[str, object]]:
    """``(column, resolved credit)`` per scorer column (``NAME`` or ``NAME@OPT=V``, :class:`oar.credit.CreditSpec`);
    ValueError for a method that reads rollout-group statistics (no signal on single completions)."""
    from oar.credit import CreditSpec

    out = []
    for col in scorers:
        resolved = CreditSpec.parse(col).resolve()
        if resolved.method.needs_group:
            raise ValueError(f"credit {resolved.method.name!r} reads rollout-group statistics: no {what}")
        out.append((col, resolved))
    return out


Scored = Iterator[tuple[str, object, float]]  # (column, token credit, CPU seconds) per column of one batch


def _credited_batches(model, tokenizer, problems: list[LabProblem], scorers: tuple[str, ...], what: str,
                      conclude: str, batch_size: int, seed: int) -> Iterator[tuple[list[LabProblem], dict, object,
                                                                                    Scored]]:
    """The worked solutions of ``problems`` in batches: ``(chunk, lab_batch, probe batch, scored)`` per batch, where
    ``scored`` yields ``(column, token credit, CPU seconds)`` for every column through :func:`oar.credit.token_credit`
    at its defaults, as in training (consume it before the next batch). One random generator, seeded once, serves
    every call in that order. ValueError before any work for an empty ``problems`` or a group-statistics method."""
    from oar.credit import CreditBatch, token_credit
    from oar.probe import OutcomeProbe

    if not problems:
        raise ValueError("problems is empty")
    methods = _columns(scorers, what)
    probe = OutcomeProbe(tokenizer, conclude=conclude)
    gen = torch.Generator().manual_seed(seed)
    model.eval()

    def scored(batch) -> Scored:
        for col, resolved in methods:
            t0 = time.thread_time()
            tc = token_credit(resolved, batch, probe=probe, batch_size=batch_size, generator=gen)
            yield col, tc, time.thread_time() - t0

    for i in range(0, len(problems), batch_size):
        chunk = problems[i : i + batch_size]
        b = lab_batch(tokenizer, chunk)
        pb = probe(b["prompt_ids"], b["prompt_mask"], b["completion_ids"], b["completion_mask"])
        yield chunk, b, pb, scored(CreditBatch(b["prompt_ids"], b["prompt_mask"], b["completion_ids"],
                                               b["completion_mask"], model=model))


def attribution_fidelity(
    model, tokenizer, problems: list[LabProblem], scorers: tuple[str, ...] = FIDELITY_SCORERS,
    conclude: str = BOXED, batch_size: int = 32, seed: int = 0,
) -> dict[str, dict[str, float]]:
    """AUC of each credit method for ranking pivotal reasoning tokens (operands, intermediate results) above
    answer-irrelevant filler, on the worked solutions of ``problems`` scored by ``model``.

    Every method runs through :func:`oar.credit.token_credit`, as in training; methods that read the rollout
    group (``ktae``) have no signal on worked solutions alone and are rejected. Returns ``{method: {"auc_filler":
    mean AUC pivotal-vs-filler, "auc_distractor": pivotal-vs-distractor (NaN without distractors), "auc_rest": mean
    AUC pivotal-vs-every other reasoning token, "completions": rows averaged, "weight_pivotal" / "weight_structure"
    / "weight_filler" / "weight_distractor": mean weight (the method's defaults) of the reasoning tokens with that
    label (NaN when there are none)}}``; AUC 0.5 is chance, 1.0 a perfect ranking; a mean weight above 1 means that
    kind of token gets more than its uniform share of the advantage.
    """
    out: dict[str, dict[str, list]] = {
        col: {"auc_filler": [], "auc_distractor": [], "auc_rest": [], "seconds": [],
              **{f"weights_{n}": [] for n in REASONING_KINDS.values()}}
        for col in scorers
    }
    for _, b, pb, scored in _credited_batches(model, tokenizer, problems, scorers, "fidelity on worked solutions",
                                              conclude, batch_size, seed):
        reasoning = pb.completion_reasoning_mask & pb.valid[:, None]
        pos = reasoning & (b["labels"] == PIVOTAL)
        for col, tc, seconds in scored:
            d = out[col]
            d["seconds"].append(seconds)
            d["auc_filler"].append(pairwise_auc(tc.scores, pos, reasoning & (b["labels"] == FILLER)))
            d["auc_distractor"].append(pairwise_auc(tc.scores, pos, reasoning & (b["labels"] == DISTRACTOR)))
            d["auc_rest"].append(pairwise_auc(tc.scores, pos, reasoning & ~pos))
            for label, n in REASONING_KINDS.items():
                d[f"weights_{n}"].append(tc.weights[reasoning & (b["labels"] == label)])
    result = {}
    for name, d in out.items():
        f, r, dis = torch.cat(d["auc_filler"]), torch.cat(d["auc_rest"]), torch.cat(d["auc_distractor"])
        result[name] = {"auc_filler": f.nanmean().item(), "auc_distractor": dis.nanmean().item(),
                        "auc_rest": r.nanmean().item(), "completions": int((~r.isnan()).sum()),
                        "cpu_s_per_solution": sum(d["seconds"]) / len(problems),
                        **{f"weight_{n}": torch.cat(d[f"weights_{n}"]).mean().item()
                           for n in REASONING_KINDS.values()}}
    return result


def token_steps(offsets: list[list[tuple[int, int]]], completions: list[str], width: int) -> torch.Tensor:
    """``[B, width]``: for each token the distance of its solution step from the answer (1 = the last written step;
    :func:`oar.lab.task.steps_from_end` of the characters it covers, the largest), 0 outside any step, on eos and
    on padding. ``offsets``: each row's token ``[start, end)`` character spans (:func:`lab_batch`)."""
    out = torch.zeros(len(completions), width, dtype=torch.long)
    for i, (spans, text) in enumerate(zip(offsets, completions, strict=True)):
        chars = steps_from_end(text, len(text))
        out[i, : len(spans)] = torch.tensor([max(chars[s:e], default=0) for s, e in spans], dtype=torch.long)
    return out


def weight_by_step(
    model, tokenizer, problems: list[LabProblem], scorers: tuple[str, ...] = ("oar-p", "oar-g", "random"),
    conclude: str = BOXED, batch_size: int = 32, seed: int = 0,
) -> dict[str, dict[int, float]]:
    """Where in the chain a credit's weights go: ``{column: {k: mean weight of the pivotal reasoning tokens of the
    steps k from the answer}}`` (k = 1 the last written step) on the worked solutions of ``problems``, every method
    through :func:`oar.credit.token_credit` at its defaults. A weight above 1 is more than the uniform share."""
    sums: dict[str, dict[int, list[float]]] = {col: {} for col in scorers}
    for chunk, b, _, scored in _credited_batches(model, tokenizer, problems, scorers,
                                                 "weight by step on worked solutions", conclude, batch_size, seed):
        step = token_steps(b["offsets"], [p.completion for p in chunk], b["completion_ids"].shape[1])
        pivotal = (b["labels"] == PIVOTAL) & (step > 0)
        for col, tc, _ in scored:
            keep = tc.mask & pivotal
            for k in step[keep].unique().tolist():
                sel = keep & (step == k)
                acc = sums[col].setdefault(k, [0.0, 0])
                acc[0] += float(tc.weights[sel].sum())
                acc[1] += int(sel.sum())
    return {col: {k: total / n for k, (total, n) in sorted(d.items())} for col, d in sums.items()}


def localisation(
    model, tokenizer, problems: list[LabProblem], scorers: tuple[str, ...] = ("oar-g", "oar-p", "random"),
    k: int = 4, temperature: float = 1.0, max_new_tokens: int = 128, batch_size: int = 32, seed: int = 0,
) -> dict[str, dict[str, float]]:
    """On the model's own failed samples whose error is a wrong step (:func:`oar.lab.task.first_wrong_step`): how
    often each method's largest weight lands on the first wrong step (``rate``; when several tokens share the
    largest weight, the share of them inside the step: the rate of a random tie-break, so a flat or 0/1 mask
    scores its chance rate rather than whatever the first tied position is), the chance rate of a uniformly
    random reasoning token (``chance``: the step's share of the reasoning tokens), the mean weight of the wrong
    step's tokens (``weight_wrong_step``; > 1 means the penalty concentrates there) and the number of completions
    (``completions``). Methods reading group statistics are rejected, as in :func:`attribution_fidelity`.
    """
    from oar.credit import CreditBatch, token_credit
    from oar.lab.model import sample
    from oar.lab.task import extract_int, first_wrong_step
    from oar.probe import OutcomeProbe

    methods = _columns(scorers, "localisation on single samples")
    from oar.lab.lm import chat_prompt

    chat = getattr(tokenizer, "chat_template", None) is not None
    prompts = [chat_prompt(tokenizer, p.prompt) if chat else p.prompt for p in problems]
    texts = sample(model, tokenizer, prompts * k, temperature, max_new_tokens, seed=seed)
    failed = []
    for p, t in zip(problems * k, texts, strict=True):
        span = first_wrong_step(p.prompt, t)
        if extract_int(t) != p.answer and span is not None:
            failed.append((p.prompt, t, span))
    out = {col: {"hits": 0.0, "chance": 0.0, "weight": 0.0, "n": 0} for col, _ in methods}
    if not failed:
        return {col: {"rate": float("nan"), "chance": float("nan"), "weight_wrong_step": float("nan"),
                      "completions": 0} for col, _ in methods}
    probe = OutcomeProbe(tokenizer, conclude=BOXED)
    gen = torch.Generator().manual_seed(seed)
    for i in range(0, len(failed), batch_size):
        chunk = failed[i : i + batch_size]
        b = lab_batch(tokenizer, [LabProblem(pr, t, 0, (ANSWER,) * len(t)) for pr, t, _ in chunk])
        batch = CreditBatch(b["prompt_ids"], b["prompt_mask"], b["completion_ids"], b["completion_mask"],
                            model=model)
        wrong = torch.zeros_like(b["completion_mask"])  # the tokens covering a character of the wrong step
        for r, ((_, _, (lo, hi)), offsets) in enumerate(zip(chunk, b["offsets"], strict=True)):
            for t, (start, end) in enumerate(offsets):
                wrong[r, t] = start < hi and end > lo
        for col, resolved in methods:
            tc = token_credit(resolved, batch, probe=probe, batch_size=batch_size, generator=gen)
            rows = tc.mask.any(dim=1) & (tc.mask & wrong).any(dim=1)
            w = tc.weights.masked_fill(~tc.mask, float("-inf"))
            top = tc.mask & (w == w.amax(dim=1, keepdim=True))  # tokens sharing the largest weight share the hit
            hit = (top & wrong).sum(1) / top.sum(1).clamp_min(1)
            share = (tc.mask & wrong).sum(1) / tc.mask.sum(1).clamp_min(1)
            w_wrong = (tc.weights * (tc.mask & wrong)).sum(1) / (tc.mask & wrong).sum(1).clamp_min(1)
            d = out[col]
            d["hits"] += float(hit[rows].sum())
            d["chance"] += float(share[rows].sum())
            d["weight"] += float(w_wrong[rows].sum())
            d["n"] += int(rows.sum())
    return {name: {"rate": d["hits"] / max(d["n"], 1), "chance": d["chance"] / max(d["n"], 1),
                   "weight_wrong_step": d["weight"] / max(d["n"], 1), "completions": d["n"]}
            for name, d in out.items()}
