"""Why does OAR-G lower greedy accuracy on the default lab task (issue #14)? Measured, not guessed.

The first study (docs/studies/first-study) ended with greedy accuracy 69.0 under GRPO and 59.8 under OAR-G (warm
start 71.9).
This benchmark trains GRPO and OAR-G from the same cached warm start with the study's recipe (default regime,
300 training seconds, one process per run), keeps the final weights, and measures on 512 held-out problems:

* **greedy failures by kind**: a wrong arithmetic step (and which part of ``a±b=c`` is wrong: the copied
  value ``a``, the operand ``b`` or the result ``c``), every written step right but a step missing or the boxed
  value wrong, or no boxed answer at all;
* **which tokens' probabilities moved**: teacher-forced on the worked (slip-free) solutions, the mean
  log-probability of the right token and how often it is the argmax, per token kind (result digits, copied
  digits, operand digits, structure, filler, answer), each model against the warm start.

Usage: ``python docs/studies/greedy-drop/greedy_drop.py --out runs/greedy-drop [--seeds 2] [--budget 300] [--resume]``
(trains 2 × seeds runs, about 6 minutes each on one core, then analyses; ``--resume`` keeps finished runs).
Writes ``greedy_drop.json`` and ``greedy_drop.md``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch

from oar.files import atomic_write, strict_json
from oar.lab.compare import finished_run
from oar.lab.model import sample
from oar.lab.pool import worker_pool
from oar.lab.run import RunConfig, train_lab
from oar.lab.stats import mean_ci
from oar.lab.task import (
    FILLERS,
    STEP_RE,
    STEP_SEP,
    TOKEN_KINDS,
    failure_kind,
    make_split,
    max_completion_chars,
    token_kinds,
)
from oar.lab.warmstart import WarmStartConfig, warm_start

CREDITS = ("grpo", "oar-g")


@torch.no_grad()
def _forward(model, tok, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``ids [B, L]`` of ``texts`` and the model's ``logits [B, L, V]`` on them."""
    enc = tok(texts, return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    return ids, model(input_ids=ids, attention_mask=mask, position_ids=pos).logits


@torch.no_grad()
def teacher_forced(model, tok, problems) -> dict[str, dict[str, float]]:
    """Per token kind: mean log-probability of the worked solution's token and the fraction where it is the
    argmax, the model fed the prompt and the right prefix."""
    model.eval()
    sums = {k: [0.0, 0.0, 0] for k in TOKEN_KINDS}
    for i in range(0, len(problems), 128):
        batch = problems[i : i + 128]
        ids, logits = _forward(model, tok, [p.prompt + p.completion for p in batch])
        logp = torch.log_softmax(logits.float(), -1)
        for r, p in enumerate(batch):
            n = len(p.completion)
            tgt = ids[r, -n:]
            lp = logp[r, -n - 1 : -1]
            right = lp.gather(1, tgt[:, None])[:, 0]
            top = lp.argmax(-1) == tgt
            for j, kind in enumerate(token_kinds(p.completion, p.labels)):
                if kind in sums:
                    s = sums[kind]
                    s[0] += right[j].item()
                    s[1] += top[j].item()
                    s[2] += 1
    return {k: {"logp": s[0] / max(s[2], 1), "top1": s[1] / max(s[2], 1), "tokens": s[2]} for k, s in sums.items()}


@torch.no_grad()
def result_accuracy_after_filler(model, tok, problems, phrase: str) -> float:
    """Teacher-forced: how often every digit of a step's result is the argmax, on the worked solutions with each
    filler phrase replaced by ``phrase`` (does the filler the model writes change its arithmetic?)."""
    model.eval()
    hits = total = 0
    for i in range(0, len(problems), 128):
        batch = problems[i : i + 128]
        comps = [STEP_SEP.join(phrase if part in FILLERS else part for part in p.completion.split(STEP_SEP))
                 for p in batch]
        ids, logits = _forward(model, tok, [p.prompt + c for p, c in zip(batch, comps, strict=True)])
        top = logits.argmax(-1)
        for r, c in enumerate(comps):
            n = len(c)
            right = (top[r, -n - 1 : -1] == ids[r, -n:]).tolist()
            for m in STEP_RE.finditer(c):
                hits += all(right[m.start(4) : m.end(4)])
                total += 1
    return hits / max(total, 1)


def greedy_fillers(texts: list[str]) -> dict[str, float]:
    """Share of each filler phrase among the filler phrases the completions write."""
    counts = {f: 0 for f in FILLERS}
    for t in texts:
        for part in t.split(STEP_SEP):
            if part in counts:
                counts[part] += 1
    n = max(sum(counts.values()), 1)
    return {f: c / n for f, c in counts.items() if c}


def analyse(model, tok, problems, max_len: int) -> dict:
    greedy = sample(model, tok, [p.prompt for p in problems], 0.0, max_len)
    cats: dict[str, int] = {}
    for p, g in zip(problems, greedy, strict=True):
        c = failure_kind(p.prompt, g, p.answer)
        cats[c] = cats.get(c, 0) + 1
    return {"greedy": {k: v / len(problems) for k, v in sorted(cats.items())},
            "greedy_length": sum(map(len, greedy)) / len(greedy), "greedy_fillers": greedy_fillers(greedy),
            "result_accuracy_after": {f: result_accuracy_after_filler(model, tok, problems, f) for f in FILLERS},
            "tokens": teacher_forced(model, tok, problems)}


def _train(args: tuple[RunConfig, str, str | None]) -> dict:
    torch.set_num_threads(1)
    return train_lab(*args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/greedy-drop")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--budget", type=float, default=300.0, help="training CPU seconds per run (the study's)")
    ap.add_argument("--problems", type=int, default=512)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    if args.seeds < 1 or args.budget <= 0 or args.problems < 1:
        ap.error(f"--seeds, --budget and --problems must be positive, got {args.seeds}, {args.budget}, "
                 f"{args.problems}")
    torch.set_num_threads(1)
    out = Path(args.out)
    warm = WarmStartConfig()
    base = RunConfig(warm=warm, budget_s=args.budget, eval_every=10_000, eval_problems=args.problems, eval_k=4,
                     save_model=True)
    runs = {(c, s): (replace(base, credit=c, seed=s), out / f"{c}-s{s}") for c in CREDITS
            for s in range(args.seeds)}
    jobs = [(cfg, str(d), None) for cfg, d in runs.values()
            if not (args.resume and finished_run(d, cfg) and (d / "model.pt").exists())]
    print(f"training {len(jobs)} run(s) on {args.workers} worker(s)", flush=True)
    with worker_pool(args.workers) as pool:
        for summary in pool.map(_train, jobs):
            print(f"  {summary['credit']}-s{summary['seed']}: {summary['steps']} steps", flush=True)

    model, tok, _ = warm_start(warm, progress=False)
    task = replace(warm.task, slip_rate=0.0)
    problems = make_split(task, "test", args.problems, seed=0)
    max_len = max_completion_chars(task) + 8  # as in train_lab
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    per_model = {"warm start": analyse(model, tok, problems, max_len)}
    for (c, s), (_, d) in runs.items():
        model.load_state_dict(torch.load(d / "model.pt", weights_only=True))
        per_model[f"{c}-s{s}"] = analyse(model, tok, problems, max_len)
        print(f"  analysed {c}-s{s}", flush=True)
    model.load_state_dict(initial)

    def agg(credit: str, get) -> dict:
        return mean_ci([get(per_model[f"{credit}-s{s}"]) for s in range(args.seeds)])

    cats = sorted({c for m in per_model.values() for c in m["greedy"]})
    result = {"seeds": args.seeds, "budget_s": args.budget, "problems": args.problems, "per_model": per_model,
              "mean": {c: {"greedy": {k: agg(c, lambda m, k=k: m["greedy"].get(k, 0.0)) for k in cats},
                           "tokens": {k: {f: agg(c, lambda m, k=k, f=f: m["tokens"][k][f]) for f in ("logp", "top1")}
                                      for k in TOKEN_KINDS}} for c in CREDITS}}
    atomic_write(out / "greedy_drop.json", strict_json(result))
    atomic_write(out / "greedy_drop.md", markdown(result, cats))
    print(markdown(result, cats))


def markdown(result: dict, cats: list[str]) -> str:
    warm, mean = result["per_model"]["warm start"], result["mean"]
    lines = [f"Greedy completions of {result['problems']} held-out problems (% of problems; mean over "
             f"{result['seeds']} seeds [95% CI])", "",
             "| outcome | warm start | " + " | ".join(CREDITS) + " |", "|---|---|" + "---|" * len(CREDITS)]
    for c in cats:
        cells = [f"{100 * mean[k]['greedy'][c]['mean']:.1f} [±{100 * mean[k]['greedy'][c]['ci95']:.1f}]"
                 for k in CREDITS]
        lines.append(f"| {c} | {100 * warm['greedy'].get(c, 0.0):.1f} | " + " | ".join(cells) + " |")
    lines += ["", "Teacher-forced on the worked solutions: mean log-probability of the right token, and how often "
              "it is the argmax (%), per token kind", "",
              "| kind | tokens | warm start log p / top-1 | "
              + " | ".join(f"{k} log p / top-1" for k in CREDITS) + " |",
              "|---|---|---|" + "---|" * len(CREDITS)]
    for kind in TOKEN_KINDS:
        w = warm["tokens"][kind]
        cells = [f"{mean[k]['tokens'][kind]['logp']['mean']:.3f} / {100 * mean[k]['tokens'][kind]['top1']['mean']:.1f}"
                 for k in CREDITS]
        lines.append(f"| {kind} | {w['tokens']} | {w['logp']:.3f} / {100 * w['top1']:.1f} | " + " | ".join(cells)
                     + " |")
    lines += ["", "Which filler phrase greedy decoding writes (share of its filler phrases, the top three per model), "
              "and how often a step's result is right (teacher-forced argmax, every digit) when every filler phrase "
              "of the worked solution is that phrase", "",
              "| model | greedy fillers | result right after 'sure' / 'so far so good' / 'step done' / mean over "
              "phrases |", "|---|---|---|"]
    for name, m in result["per_model"].items():
        top3 = sorted(m["greedy_fillers"].items(), key=lambda kv: -kv[1])[:3]
        acc = m["result_accuracy_after"]
        lines.append(f"| {name} | " + ", ".join(f"{f!r} {100 * v:.0f}%" for f, v in top3) + " | "
                     + " / ".join(f"{100 * acc[f]:.1f}" for f in ("sure", "so far so good", "step done"))
                     + f" / {100 * sum(acc.values()) / len(acc):.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
