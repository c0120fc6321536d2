"""Cheaper OAR on the lab: how much of exact OAR-P's ranking each cheap estimator keeps, and what it costs.

``--part ranking``: on the worked solutions of held-out lab problems, scored by the cached warm-started lab model
(``oar.lab.warmstart.warm_start``), every variant runs through :func:`oar.credit.token_credit` (as in training)
and is compared with exact OAR-P: per-completion Spearman over all reasoning tokens and over the tokens the
variant boosts (Bi-Level weight > 1), the fidelity AUC of pivotal tokens over filler / over the rest
(:func:`oar.lab.fidelity.pairwise_auc`, as ``oar.lab.fidelity.attribution_fidelity``) and the scorer's wall and
process CPU seconds (one torch thread: the CPU seconds hold up on a shared machine).

``--part steps``: median step time of the lab trainer (``oar.lab.run.train_lab``, the lab's RL recipe) per variant
over a few steps (first dropped), wall and process CPU seconds of ``training_step`` (generation, scoring, loss
forward/backward) and its breakdown (generation, scoring, rest of the rollout, loss forward, backward), next to
GRPO's, with gradient checkpointing off (the lab preset) and, for GRPO and OAR-G, on (TRL's default).

    OMP_NUM_THREADS=1 python docs/studies/cheap-oar/cheap_oar.py --part ranking [--problems 128] [--out FILE]
    OMP_NUM_THREADS=1 python docs/studies/cheap-oar/cheap_oar.py --part steps [--steps 6] [--out FILE]
    ... [--variants "oar-p span=2,oar-p horizon=2"]   (only these, next to the reference)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from dataclasses import replace

import torch
from span_correlation import spearman

# (label, credit, options): exact OAR-P first (the reference), then the cheap estimators of it, then OAR-G; a copy
# under a horizon re-runs only a few columns, so 64 of them share a forward (per-forward overhead dominates here)
VARIANTS: list[tuple[str, str, dict]] = [
    ("oar-p exact", "oar-p", {}),
    ("oar-pg k=0.1", "oar-pg", {"k": 0.1}),
    ("oar-pg k=0.25", "oar-pg", {"k": 0.25}),
    ("oar-pg k=0.5", "oar-pg", {"k": 0.5}),
    ("oar-pg k=0.1 below", "oar-pg", {"k": 0.1, "calibration": "below"}),
    ("oar-pg k=0.25 below", "oar-pg", {"k": 0.25, "calibration": "below"}),
    ("oar-p span=2", "oar-p", {"span": 2}),
    ("oar-p span=4", "oar-p", {"span": 4}),
    ("oar-p horizon=0", "oar-p", {"horizon": 0, "chunk_size": 64}),
    ("oar-p horizon=2", "oar-p", {"horizon": 2, "chunk_size": 64}),
    ("oar-p horizon=4", "oar-p", {"horizon": 4, "chunk_size": 64}),
    ("oar-p horizon=8", "oar-p", {"horizon": 8, "chunk_size": 64}),
    ("oar-g answer_mean", "oar-g", {"mode": "answer_mean", "noise_std": 1e-3}),
    ("oar-g answer_joint σ=0", "oar-g", {"mode": "answer_joint", "noise_std": 0.0}),
]
# (label, gradient checkpointing): TRL's default (on) is the "before" of issue #12, the lab preset (off) the "after"
STEP_VARIANTS: list[tuple[str, bool]] = [
    ("grpo", True), ("oar-g answer_mean", True),
    ("grpo", False), ("oar-g answer_mean", False), ("oar-g answer_joint σ=0", False), ("oar-p exact", False),
    ("oar-pg k=0.1", False), ("oar-pg k=0.25", False), ("oar-p span=2", False),
    ("oar-p horizon=0", False), ("oar-p horizon=2", False), ("oar-p horizon=4", False), ("oar-p horizon=8", False),
]
# the parts of a step, each the process CPU seconds of one trainer method (one torch thread)
PARTS = {"step": "training_step", "prepare": "_prepare_inputs", "generation": "_generate",
         "scoring": "_token_credit", "loss_forward": "compute_loss"}


def ranking(n_problems: int, batch_size: int, labels: list[str] | None = None) -> dict:
    from oar.credit import CreditBatch, token_credit
    from oar.lab.fidelity import lab_batch, pairwise_auc
    from oar.lab.task import BOXED, FILLER, PIVOTAL, make_split
    from oar.lab.warmstart import WarmStartConfig, warm_start
    from oar.probe import OutcomeProbe

    cfg = WarmStartConfig()
    model, tok, path = warm_start(cfg, progress=False)
    problems = make_split(replace(cfg.task, slip_rate=0.0), "test", n_problems)
    probe = OutcomeProbe(tok, conclude=BOXED)
    results: dict[str, dict[str, list]] = {v[0]: {"rho_all": [], "rho_boosted": [], "auc_filler": [], "auc_rest": [],
                                                  "seconds": 0.0, "cpu_seconds": 0.0}
                                              for v in VARIANTS if labels is None or v[0] in labels or v is VARIANTS[0]}
    n_tokens = 0
    for i in range(0, len(problems), batch_size):
        b = lab_batch(tok, problems[i : i + batch_size])
        batch = CreditBatch(b["prompt_ids"], b["prompt_mask"], b["completion_ids"], b["completion_mask"],
                            model=model)
        exact = None
        for label, credit, options in VARIANTS:
            if label not in results:
                continue
            gen = torch.Generator().manual_seed(i)
            t0, c0 = time.perf_counter(), time.process_time()
            tc = token_credit(credit, batch, probe=probe, batch_size=batch_size, generator=gen, options=options)
            r = results[label]
            r["seconds"] += time.perf_counter() - t0
            r["cpu_seconds"] += time.process_time() - c0
            if exact is None:
                exact, n_tokens = tc, n_tokens + int(tc.mask.sum())
            pos = tc.mask & (b["labels"] == PIVOTAL)
            r["auc_filler"].append(pairwise_auc(tc.scores, pos, tc.mask & (b["labels"] == FILLER)))
            r["auc_rest"].append(pairwise_auc(tc.scores, pos, tc.mask & ~pos))
            for row in range(tc.mask.shape[0]):
                m = tc.mask[row] & exact.mask[row]
                boosted = m & (tc.weights[row] > 1)
                for key, sel in (("rho_all", m), ("rho_boosted", boosted)):
                    if int(sel.sum()) >= 3:
                        r[key].append(spearman(tc.scores[row][sel], exact.scores[row][sel]))

    def mean(values: list[float]) -> float:
        finite = [v for v in values if math.isfinite(v)]
        return round(statistics.mean(finite), 3) if finite else float("nan")

    out = {}
    for label, r in results.items():
        f, rest = torch.cat(r["auc_filler"]), torch.cat(r["auc_rest"])
        out[label] = {"spearman_all": mean(r["rho_all"]), "spearman_boosted": mean(r["rho_boosted"]),
                      "spearman_boosted_min": round(min(r["rho_boosted"]), 3) if r["rho_boosted"] else None,
                      "auc_filler": round(f.nanmean().item(), 3), "auc_rest": round(rest.nanmean().item(), 3),
                      "seconds": round(r["seconds"], 2), "cpu_seconds": round(r["cpu_seconds"], 2)}
    return {"warm_start": path.name, "problems": len(problems), "reasoning_tokens": n_tokens, "results": out}


def _cpu_timed(cls: type, name: str, sink: list[float]) -> None:
    """Wrap ``cls.name`` so each call appends its process CPU seconds to ``sink`` (one torch thread: robust to
    other load on the machine, unlike wall time)."""
    fn = getattr(cls, name)

    def timed(self, *args, **kwargs):
        c0 = time.process_time()
        try:
            return fn(self, *args, **kwargs)
        finally:
            sink.append(time.process_time() - c0)

    setattr(cls, name, timed)


def steps(n_steps: int, labels: list[str] | None = None) -> dict:
    """Median CPU seconds per step and its breakdown: generation (``_generate``), scoring (``_token_credit``),
    the rest of the rollout (rewards, old log-probs: ``_prepare_inputs`` minus both), the loss forward
    (``compute_loss``) and the backward (``training_step`` minus ``_prepare_inputs`` and ``compute_loss``)."""
    from oar.credit import CreditSpec
    from oar.files import iter_jsonl
    from oar.lab.run import RunConfig, train_lab
    from oar.trainer import OARGRPOTrainer

    cpu: dict[str, list[float]] = {part: [] for part in PARTS}
    for part, method in PARTS.items():
        _cpu_timed(OARGRPOTrainer, method, cpu[part])
    variants = {"grpo": ("grpo", {}), **{v[0]: (v[1], v[2]) for v in VARIANTS}}
    out = {}
    for label, checkpointing in STEP_VARIANTS:
        if labels is not None and label not in labels and (label, checkpointing) != ("grpo", False):
            continue
        credit, options = variants[label]
        cfg = RunConfig(credit=str(CreditSpec(credit, options)), max_steps=n_steps, budget_s=1e9,
                        eval_every=10_000, eval_problems=8, eval_k=1, gradient_checkpointing=checkpointing)
        for sink in cpu.values():
            sink.clear()
        with tempfile.TemporaryDirectory() as tmp:
            train_lab(cfg, tmp)
            rows = [r for _, r in iter_jsonl(f"{tmp}/metrics.jsonl") if "step_time" in r][1:]
        per_step = {part: (sink + [0.0] * n_steps)[1:n_steps] for part, sink in cpu.items()}  # first step dropped
        parts = {
            "generation": per_step["generation"],
            "scoring": per_step["scoring"],
            "rollout_rest": [p - g - s for p, g, s in
                             zip(per_step["prepare"], per_step["generation"], per_step["scoring"], strict=True)],
            "loss_forward": per_step["loss_forward"],
            "backward": [t - p - f for t, p, f in
                         zip(per_step["step"], per_step["prepare"], per_step["loss_forward"], strict=True)],
        }
        key = f"{label} | checkpointing {'on' if checkpointing else 'off'}"
        out[key] = {"step_time": statistics.median(r["step_time"] for r in rows),
                    "cpu_step": statistics.median(per_step["step"]),
                    **{f"cpu_{k}": round(statistics.median(v), 4) for k, v in parts.items()}}
        print(key, out[key], flush=True)
    ref = out["grpo | checkpointing off"]
    for r in out.values():
        r["x_grpo"] = round(r["step_time"] / ref["step_time"], 2)
        r["cpu_x_grpo"] = round(r["cpu_step"] / ref["cpu_step"], 2)
        r["cpu_scoring_share"] = round(r["cpu_scoring"] / r["cpu_step"], 3)
    return {"steps_timed": n_steps - 1, "statistic": "median", "reference": "grpo | checkpointing off",
            "results": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("ranking", "steps"), required=True)
    ap.add_argument("--problems", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6, help="trainer steps per variant (the first is not timed)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--variants", default=None,
                    help="comma-separated labels to run (default all; the reference, exact OAR-P or GRPO, always runs)")
    a = ap.parse_args()
    labels = None if a.variants is None else [v.strip() for v in a.variants.split(",")]
    unknown = sorted(set(labels or []) - {v[0] for v in VARIANTS} - {"grpo"})
    if unknown:
        ap.error(f"unknown --variants {unknown}; valid: {', '.join(v[0] for v in VARIANTS)}")
    if a.problems < 1 or a.steps < 2 or a.batch_size < 1:
        ap.error(f"--problems and --batch-size must be >= 1 and --steps >= 2, got {a.problems}, {a.batch_size}, "
                 f"{a.steps}")
    torch.set_num_threads(1)
    res = ranking(a.problems, a.batch_size, labels) if a.part == "ranking" else steps(a.steps, labels)
    text = json.dumps(res, indent=1, ensure_ascii=False)
    print(text)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
