"""``oar compare``: GRPO and OAR trained side by side on the lab under the same budget and seeds.

Each (credit, seed) run is one single-thread process (``workers`` at a time, one per core); every run of a
seed starts from the same cached warm start and draws the same prompts. Writes ``results.json`` and
``results.md`` next to the run directories.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from oar.credit import get_credit
from oar.files import atomic_write, read_jsonl
from oar.lab.run import RunConfig, train_lab
from oar.lab.warmstart import WarmStartConfig, warm_start

# two-sided 95% Student-t quantiles, by degrees of freedom (normal beyond 30)
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


@dataclass(frozen=True)
class ComparePreset:
    """What one ``oar compare`` mode runs: credits × seeds runs of ``budget_s`` training seconds each."""

    credits: tuple[str, ...]
    seeds: int
    budget_s: float
    eval_every: int
    eval_problems: int
    eval_k: int
    run: dict = field(default_factory=dict)  # extra RunConfig fields
    warm_steps: int | None = None  # SFT steps of the warm start (None: WarmStartConfig's default)


PRESETS: dict[str, ComparePreset] = {
    "quick": ComparePreset(("grpo", "oar-g"), 1, 30.0, 10, 64, 2, warm_steps=250),
    "default": ComparePreset(("grpo", "oar-g"), 2, 240.0, 20, 256, 4),
    "study": ComparePreset(("grpo", "oar-g", "oar-p"), 6, 300.0, 30, 512, 4),
}


def credit_column(spec: str) -> tuple[str, dict]:
    """A comparison column ``NAME`` or ``NAME@OPT=VALUE&OPT=VALUE`` (e.g. ``oar-g@beta=2``): the credit and its
    options (values parsed as JSON, else kept as text). ValueError naming an unknown credit or option."""
    name, _, opts = spec.strip().partition("@")
    options = {}
    for pair in filter(None, opts.split("&")):
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"credit column {spec!r}: expected OPT=VALUE after '@', got {pair!r}")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value.strip()
    get_credit(name).check_options(options)  # ValueError naming an unknown credit or option
    return name.strip().lower(), options


def t_quantile(df: int) -> float:
    """Two-sided 95% Student-t quantile for ``df`` degrees of freedom (tabulated, conservative between rows)."""
    if df < 1:
        return float("nan")
    return _T975[min((k for k in _T975 if k >= df), default=30)] if df <= 30 else 1.96


def mean_ci(values: list[float]) -> dict[str, float]:
    """``mean``, sample ``std`` and the 95% CI half-width ``ci95`` (Student t; NaN with one value)."""
    n = len(values)
    mean = sum(values) / n if n else float("nan")
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else float("nan")
    return {"mean": mean, "std": std, "ci95": t_quantile(n - 1) * std / math.sqrt(n) if n > 1 else float("nan"),
            "n": n}


def diff_ci(a: list[float], b: list[float]) -> dict[str, float]:
    """Difference of means ``mean(a) - mean(b)`` with its 95% CI half-width ``ci95`` (Welch's t; NaN if n < 2)."""
    sa, sb = mean_ci(a), mean_ci(b)
    diff = sa["mean"] - sb["mean"]
    if sa["n"] < 2 or sb["n"] < 2:
        return {"mean": diff, "ci95": float("nan"), "n": min(sa["n"], sb["n"])}
    va, vb = sa["std"] ** 2 / sa["n"], sb["std"] ** 2 / sb["n"]
    se = math.sqrt(va + vb)
    den = va**2 / (sa["n"] - 1) + vb**2 / (sb["n"] - 1)
    df = (va + vb) ** 2 / den if den > 0 else sa["n"] + sb["n"] - 2  # Welch–Satterthwaite
    return {"mean": diff, "ci95": t_quantile(int(df)) * se, "n": min(sa["n"], sb["n"])}


def _accuracy_at(curve: list[tuple[int, float, float]], step: float) -> float:
    """Held-out accuracy of one run after ``step`` updates, linearly interpolated between its evaluations."""
    steps, accs = [s for s, _, _ in curve], [a for _, _, a in curve]
    if not steps[0] <= step <= steps[-1]:
        raise ValueError(f"step {step} is outside the evaluated range {steps[0]}..{steps[-1]}")
    return float(np.interp(step, steps, accs))


def _mean_key(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return sum(vals) / len(vals) if vals else float("nan")


def summarize(run_dirs: dict[tuple[str, int], Path], reference: str = "grpo") -> dict:
    """Aggregate run directories into the results object (per credit, over seeds).

    Per run: start/final held-out ``eval/accuracy`` (sampled avg@k; final = mean of the last two evaluations),
    greedy accuracy, steps, training seconds, mean ``step_time``, importance share, mean grad norm, clipped
    fraction, weight ESS ratio and the final entropy; ``steps_to_ref``/``seconds_to_ref``: first evaluation after
    step 0 reaching the ``reference`` credit's mean final accuracy (None if never).
    Per credit, against the reference: ``final_diff`` (difference of mean final accuracies, Welch 95% CI) and, at
    ``matched_step`` (the fewest updates any run of the credit or of the reference made), ``matched_accuracy``,
    ``ref_matched_accuracy`` and ``matched_diff``; accuracies between evaluations are linearly interpolated.
    """
    runs = {k: read_jsonl(d / "metrics.jsonl") for k, d in run_dirs.items()}
    per_run = {}
    for (credit, seed), rows in runs.items():
        evals = [r for r in rows if "eval/accuracy" in r]
        train = [r for r in rows if "step_time" in r]
        final = sum(r["eval/accuracy"] for r in evals[-2:]) / len(evals[-2:])
        per_run[(credit, seed)] = {
            "credit": credit, "seed": seed, "start_accuracy": evals[0]["eval/accuracy"], "final_accuracy": final,
            "start_greedy": evals[0]["eval/greedy_accuracy"], "final_greedy": evals[-1]["eval/greedy_accuracy"],
            "final_pass_at_k": evals[-1]["eval/pass_at_k"], "steps": evals[-1]["step"],
            "train_seconds": evals[-1]["wall_time"], "step_time": _mean_key(train, "step_time"),
            "importance_share": _mean_key(train, "oar/importance_share"),
            "grad_norm": _mean_key(train, "grad_norm"), "grad_clipped": _mean_key(train, "oar/grad_clipped"),
            "ess_ratio": _mean_key(train, "oar/ess_ratio"), "reward": _mean_key(train[-10:], "reward"),
            "final_entropy": train[-1].get("entropy", float("nan")) if train else float("nan"),
            "start_entropy": train[0].get("entropy", float("nan")) if train else float("nan"),
            "curve": [(r["step"], r["wall_time"], r["eval/accuracy"]) for r in evals],
        }
    credits = list(dict.fromkeys(c for c, _ in per_run))
    ref_runs = [r for (c, _), r in per_run.items() if c == reference]
    target = sum(r["final_accuracy"] for r in ref_runs) / len(ref_runs) if ref_runs else None
    for r in per_run.values():
        hit = next(((s, t) for s, t, a in r["curve"][1:] if target is not None and a >= target), None)
        r["steps_to_ref"], r["seconds_to_ref"] = hit if hit else (None, None)
    by_credit = {}
    for c in credits:
        rs = [r for (cc, _), r in sorted(per_run.items()) if cc == c]
        agg = {k: mean_ci([r[k] for r in rs]) for k in (
            "start_accuracy", "final_accuracy", "final_greedy", "final_pass_at_k", "steps", "train_seconds",
            "step_time", "importance_share", "grad_norm", "grad_clipped", "ess_ratio", "final_entropy")}
        agg["gain"] = mean_ci([r["final_accuracy"] - r["start_accuracy"] for r in rs])
        if ref_runs:  # same number of updates: the fewest steps any run of c or of the reference made
            matched = min(r["curve"][-1][0] for r in rs + ref_runs)
            mine = [_accuracy_at(r["curve"], matched) for r in rs]
            ref = [_accuracy_at(r["curve"], matched) for r in ref_runs]
            agg.update(matched_step=matched, matched_accuracy=mean_ci(mine), ref_matched_accuracy=mean_ci(ref),
                       matched_diff=diff_ci(mine, ref),
                       final_diff=diff_ci([r["final_accuracy"] for r in rs], [r["final_accuracy"] for r in ref_runs]))
        reached = [r for r in rs if r["steps_to_ref"] is not None]
        agg["reached_ref"] = f"{len(reached)}/{len(rs)}"
        agg["steps_to_ref"] = mean_ci([r["steps_to_ref"] for r in reached]) if reached else None
        agg["seconds_to_ref"] = mean_ci([r["seconds_to_ref"] for r in reached]) if reached else None
        by_credit[c] = agg
    return {"reference": reference, "reference_final_accuracy": target, "credits": by_credit,
            "runs": list(per_run.values())}


def _fmt(s: dict | None, scale: float = 1.0, digits: int = 1) -> str:
    if not s or s["mean"] is None or s["mean"] != s["mean"]:
        return "–"
    txt = f"{s['mean'] * scale:.{digits}f}"
    if s["n"] > 1:
        txt += f" ± {s['std'] * scale:.{digits}f} [±{s['ci95'] * scale:.{digits}f}]"
    return txt


def _fmt_diff(d: dict | None, scale: float = 100.0) -> str:
    if not d or d["mean"] is None or d["mean"] != d["mean"]:
        return "–"
    ci = f" [±{d['ci95'] * scale:.1f}]" if d["ci95"] == d["ci95"] and d["ci95"] is not None else ""
    return f"{d['mean'] * scale:+.1f}{ci}"


def markdown_table(results: dict) -> str:
    """The results as a Markdown table (accuracies in points: mean ± std [95% CI half-width])."""
    ref_name = results["reference"]
    head = (f"| credit | held-out acc start → final | gain | Δ final vs {ref_name} | matched step "
            f"| acc @ matched (vs {ref_name}) | greedy final | steps | s/step | importance share "
            "| steps to ref | s to ref | grad norm | clipped | ESS | final entropy |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for c, a in results["credits"].items():
        matched = (f"{_fmt(a['matched_accuracy'], 100)} vs {_fmt(a['ref_matched_accuracy'], 100)}: "
                   f"{_fmt_diff(a['matched_diff'])}" if "matched_step" in a else "–")
        lines.append(
            f"| {c} | {_fmt(a['start_accuracy'], 100)} → {_fmt(a['final_accuracy'], 100)} | {_fmt(a['gain'], 100)} "
            f"| {_fmt_diff(a.get('final_diff'))} | {a.get('matched_step', '–')} | {matched} "
            f"| {_fmt(a['final_greedy'], 100)} | {_fmt(a['steps'], 1, 0)} | {_fmt(a['step_time'], 1, 2)} "
            f"| {_fmt(a['importance_share'], 100)}% | {_fmt(a['steps_to_ref'], 1, 0)} ({a['reached_ref']}) "
            f"| {_fmt(a['seconds_to_ref'], 1, 0)} | {_fmt(a['grad_norm'], 1, 2)} | {_fmt(a['grad_clipped'], 100, 0)}% "
            f"| {_fmt(a['ess_ratio'], 1, 2)} | {_fmt(a['final_entropy'], 1, 3)} |")
    ref = results["reference_final_accuracy"]
    notes = [f"Held-out accuracy: sampled avg@k on fixed test problems, in points, mean ± std over seeds [95% CI "
             f"half-width]; Δ: difference of means vs {ref_name} [Welch 95% CI]; matched step: the fewest updates "
             f"any run of that credit or of {ref_name} made (accuracy interpolated between evaluations); "
             f"ref = {ref_name} final mean ({ref * 100:.1f})." if ref is not None else ""]
    return "\n".join(lines + [""] + notes) + "\n"


def _finite(obj):
    """NaN/inf → None, recursively, so results.json is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def finished_run(run_dir: Path, cfg: RunConfig) -> bool:
    """Whether ``run_dir`` holds a completed lab run trained with exactly ``cfg``, proven by its own
    ``metrics.jsonl``: the last record is the held-out evaluation taken when training stopped (``budget_s``
    spent or ``max_steps`` reached), and ``summary.json`` names that same final evaluation. A ``summary.json``
    left over from an earlier run in the same directory proves nothing (the rerun restarted the metrics)."""
    try:
        meta = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        rows = read_jsonl(run_dir / "metrics.jsonl")
    except (OSError, ValueError):
        return False
    if meta.get("lab") != json.loads(json.dumps(asdict(cfg))) or not rows or "eval/accuracy" not in rows[-1]:
        return False
    last = rows[-1]
    stopped = last.get("wall_time", 0.0) >= cfg.budget_s or last.get("step", 0) >= cfg.max_steps
    return stopped and isinstance(summary, dict) and summary.get("final") == last


def _die_with_parent(parent: int, poll_s: float = 0.5) -> None:
    """Pool-worker initializer: a daemon thread ends this process as soon as ``parent`` is gone (a killed
    ``oar compare`` must not leave a worker training into a run directory a resumed compare will use)."""
    import os
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="oar-die-with-parent", daemon=True).start()


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """``workers`` spawned processes that exit when this process dies (see :func:`_die_with_parent`)."""
    import os

    return ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_die_with_parent,
                               initargs=(os.getpid(),))


def _job(args: tuple[RunConfig, str, str | None]) -> dict:
    import torch

    torch.set_num_threads(1)
    cfg, run_dir, cache_dir = args
    return train_lab(cfg, run_dir, cache_dir)


def compare(
    out_dir: str | Path, preset: str = "default", credits: tuple[str, ...] | None = None,
    seeds: int | None = None, budget_s: float | None = None, verbosity: int | None = None, workers: int = 2,
    warm: WarmStartConfig | None = None, cache_dir: str | Path | None = None, report: bool = True,
    run_overrides: dict | None = None, resume: bool = False, regime: str | None = None,
) -> dict:
    """Run every (credit, seed) of ``preset`` (overridden by the arguments) and write the results.

    ``run_overrides``: extra :class:`RunConfig` fields applied to every run (e.g. ``{"lr": 3e-4}``).
    ``regime``: task overrides of :data:`oar.lab.regimes.REGIMES` (applied before ``verbosity``).
    ``resume``: keep the finished runs already in ``out_dir`` whose configuration is the one this call would
    run (an interrupted comparison continues where it stopped); every other run is trained from the start.

    Returns the results object (also in ``out_dir/results.json``; table in ``out_dir/results.md``).
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {preset!r}")
    p = PRESETS[preset]
    columns = {c.strip().lower(): credit_column(c) for c in (credits or p.credits)}  # ValueError naming the bad one
    credits = tuple(columns)
    seeds = p.seeds if seeds is None else seeds
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    warm = warm or (WarmStartConfig(steps=p.warm_steps) if p.warm_steps else WarmStartConfig())
    if regime is not None:
        from oar.lab.regimes import apply_regime

        warm = apply_regime(warm, regime)
    if verbosity is not None:
        warm = replace(warm, task=replace(warm.task, verbosity=verbosity))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    _, _, warm_path = warm_start(warm, cache_dir)  # once, before the workers (they load the cache)
    warm_s = time.perf_counter() - t0
    fields = {"budget_s": budget_s or p.budget_s, "eval_every": p.eval_every, "eval_problems": p.eval_problems,
              "eval_k": p.eval_k, **p.run, **(run_overrides or {})}
    base = RunConfig(warm=warm, **fields)
    jobs, dirs = [], {}
    for seed in range(seeds):  # seed-major: the credits of one seed run side by side on the cores
        for c in credits:
            name, options = columns[c]
            cfg = replace(base, credit=name, seed=seed,
                          oar={**base.oar, "credit_options": options} if options else base.oar)
            run_dir = out / f"{c}-s{seed}"
            dirs[(c, seed)] = run_dir
            if not (resume and finished_run(run_dir, cfg)):
                jobs.append((cfg, str(run_dir), str(cache_dir) if cache_dir else None))
    _run_jobs(jobs, workers)
    results = summarize(dirs, reference="grpo" if "grpo" in credits else credits[0])
    results.update({"preset": preset, "warm_start": str(warm_path), "warm_start_seconds": warm_s,
                    "wall_seconds": time.perf_counter() - t0, "config": asdict(base), "seeds": seeds,
                    "workers": workers})
    atomic_write(out / "results.json", json.dumps(_finite(results), indent=1, allow_nan=False))
    atomic_write(out / "results.md", markdown_table(results))
    if report:
        try:
            from oar.viz.report import write_report
        except ImportError:
            pass
        else:
            write_report([str(d) for d in dirs.values()], out, results=results)
    return results


def _run_jobs(jobs: list, workers: int) -> None:
    from rich.progress import Progress

    with Progress() as prog:
        task = prog.add_task(f"{len(jobs)} runs on {workers} worker(s)", total=len(jobs))
        if workers == 1:
            for j in jobs:
                _job(j)
                prog.advance(task)
            return
        with worker_pool(workers) as pool:
            for _ in pool.map(_job, jobs):
                prog.advance(task)
