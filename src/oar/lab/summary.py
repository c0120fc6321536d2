"""The results of ``oar compare``: run directories aggregated per credit (``summarize_comparison``), rendered
as the Markdown table of ``results.md`` and ``report.md`` (``format_results_table``) and as the compact terminal
summary (``terminal_summary``)."""

from __future__ import annotations

from pathlib import Path

from oar.lab.stats import accuracy_at, diff_ci, first_reach, mean_accuracy_until, mean_ci, ratio_ci
from oar.rundir import RunDir

ORACLE_PREFIX = "oracle-"  # columns whose credit starts so are the headroom's upper bounds (oar.lab.oracle)
GAIN_SHARE = 0.9  # updates to reach this share of the reference's final gain


def _mean_key(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return sum(vals) / len(vals) if vals else float("nan")


def summarize_comparison(run_dirs: dict[tuple[str, int], Path], reference: str = "grpo") -> dict:
    """Aggregate run directories into the results object (per credit, over seeds).

    Per run: start/final held-out ``eval/accuracy`` (sampled avg@k; final = mean of the last two evaluations
    after step 0: the start evaluation never enters it, so a run with one evaluation after it takes that one),
    greedy accuracy, steps, training seconds, mean ``step_time``, importance share, mean grad norm, clipped
    fraction, weight ESS ratio, the final entropy, the mean completion length (tokens) and ``vine``'s extra
    generated continuation tokens per update (``rollout_tokens``; NaN for a credit that samples none);
    ``steps_to_ref``/``seconds_to_ref``: first evaluation after step 0 reaching the ``reference`` credit's mean
    final accuracy (None if never).
    Per credit, against the reference: ``final_diff`` (difference of mean final accuracies, Welch 95% CI) and, at
    ``matched_step`` (the fewest updates any run of the credit or of the reference made), ``matched_accuracy``,
    ``ref_matched_accuracy`` and ``matched_diff``; accuracies between evaluations are linearly interpolated.
    """
    runs = {k: RunDir(d).metrics() for k, d in run_dirs.items()}
    per_run = {}
    for (credit, seed), rows in runs.items():
        evals = [r for r in rows if "eval/accuracy" in r]
        train = [r for r in rows if "step_time" in r]
        last = [r for r in evals if r["step"] > 0][-2:] or evals[:1]
        final = sum(r["eval/accuracy"] for r in last) / len(last)
        per_run[(credit, seed)] = {
            "credit": credit, "seed": seed, "start_accuracy": evals[0]["eval/accuracy"], "final_accuracy": final,
            "start_greedy": evals[0]["eval/greedy_accuracy"], "final_greedy": evals[-1]["eval/greedy_accuracy"],
            "final_pass_at_k": evals[-1]["eval/pass_at_k"], "steps": evals[-1]["step"],
            "train_seconds": evals[-1]["wall_time"], "step_time": _mean_key(train, "step_time"),
            "importance_share": _mean_key(train, "oar/importance_share"),
            "grad_norm": _mean_key(train, "grad_norm"), "grad_clipped": _mean_key(train, "oar/grad_clipped"),
            "ess_ratio": _mean_key(train, "oar/ess_ratio"), "reward": _mean_key(train[-10:], "reward"),
            "rollout_tokens": _mean_key(train, "oar/rollout_tokens"),
            "completion_length": _mean_key(train, "completions/mean_length"),
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
            "step_time", "importance_share", "grad_norm", "grad_clipped", "ess_ratio", "final_entropy",
            "rollout_tokens", "completion_length")}
        agg["gain"] = mean_ci([r["final_accuracy"] - r["start_accuracy"] for r in rs])
        if ref_runs:  # same number of updates: the fewest steps any run of c or of the reference made
            matched = min(r["curve"][-1][0] for r in rs + ref_runs)
            mine = [accuracy_at(r["curve"], matched) for r in rs]
            ref = [accuracy_at(r["curve"], matched) for r in ref_runs]
            agg.update(matched_step=matched, matched_accuracy=mean_ci(mine), ref_matched_accuracy=mean_ci(ref),
                       matched_diff=diff_ci(mine, ref),
                       final_diff=diff_ci([r["final_accuracy"] for r in rs], [r["final_accuracy"] for r in ref_runs]))
        reached = [r for r in rs if r["steps_to_ref"] is not None]
        agg["reached_ref"] = f"{len(reached)}/{len(rs)}"
        agg["steps_to_ref"] = mean_ci([r["steps_to_ref"] for r in reached]) if reached else None
        agg["seconds_to_ref"] = mean_ci([r["seconds_to_ref"] for r in reached]) if reached else None
        by_credit[c] = agg
    if ref_runs:
        _add_headroom(per_run, by_credit, reference)
    return {"reference": reference, "reference_final_accuracy": target, "credits": by_credit,
            "runs": list(per_run.values())}


def is_oracle(column: str) -> bool:
    """Whether a comparison column is an oracle credit (``oracle-NAME``, with or without ``@options``)."""
    return column.partition("@")[0].startswith(ORACLE_PREFIX)


def _add_headroom(per_run: dict, by_credit: dict, reference: str) -> None:
    """Headroom metrics per credit, added to ``by_credit`` in place (docs/lab.md, "headroom metrics"):

    ``auc_updates`` / ``auc_seconds``: mean held-out accuracy over the first ``matched_step`` updates / over the
    training seconds both credits ran (the normalised area under the curve), per credit and its Welch difference
    to the reference (``*_diff``); ``steps_to_gain`` / ``seconds_to_gain``: updates and seconds to reach
    ``GAIN_SHARE`` of the reference's mean final gain (runs that never do are counted in ``reached_gain``), and
    their Welch difference to the reference (``*_diff``) only where every run of both reached it (else None);
    with oracle columns, ``efficiency_updates`` / ``efficiency_budget``: (credit − reference) / (best oracle −
    reference) at a step every run of the three made / at the end of the budget, with a paired bootstrap CI over
    seeds (:func:`oar.lab.stats.ratio_ci`). The best oracle is the one with the largest ``matched_diff``.
    """
    def runs(credit: str) -> dict[int, dict]:
        return {s: r for (c, s), r in per_run.items() if c == credit}

    ref = runs(reference)
    start = sum(r["start_accuracy"] for r in ref.values()) / len(ref)
    final = sum(r["final_accuracy"] for r in ref.values()) / len(ref)
    target = start + GAIN_SHARE * (final - start)

    def times_to_gain(rs: dict[int, dict], axis: int) -> list[float]:  # of the runs that reached the target
        return [h for r in rs.values() if (h := first_reach(r["curve"], target, axis)) is not None]

    ref_times = {axis: times_to_gain(ref, axis) for axis in (0, 1)}
    for c, agg in by_credit.items():
        mine = runs(c)
        budget = min(r["curve"][-1][1] for r in [*mine.values(), *ref.values()])
        for key, until, axis in (("auc_updates", agg["matched_step"], 0), ("auc_seconds", budget, 1)):
            if any(r["curve"][0][axis] >= until for r in [*mine.values(), *ref.values()]):  # nothing to average
                agg[key] = agg[f"{key}_diff"] = None
                continue
            a = [mean_accuracy_until(r["curve"], until, axis) for r in mine.values()]
            b = [mean_accuracy_until(r["curve"], until, axis) for r in ref.values()]
            agg[key], agg[f"{key}_diff"] = mean_ci(a), diff_ci(a, b)
        for key, axis in (("steps_to_gain", 0), ("seconds_to_gain", 1)):
            hits, ref_hits = times_to_gain(mine, axis), ref_times[axis]
            agg[key] = mean_ci(hits) if hits else None
            uncensored = len(hits) == len(mine) and len(ref_hits) == len(ref)  # a run that never reached it
            agg[f"{key}_diff"] = diff_ci(hits, ref_hits) if uncensored else None  # has no time to compare
        agg["reached_gain"] = f"{len(hits)}/{len(mine)}"
    oracles = [c for c in by_credit if is_oracle(c)]
    if not oracles:
        return
    best = max(oracles, key=lambda c: by_credit[c]["matched_diff"]["mean"])
    top = runs(best)

    def gap(rs: dict[int, dict], step: int) -> dict[int, float]:  # per seed: accuracy after `step` updates - ref's
        return {s: accuracy_at(r["curve"], step) - accuracy_at(ref[s]["curve"], step)
                for s, r in rs.items() if s in ref}

    def fin(rs: dict[int, dict]) -> dict[int, float]:  # per seed: final accuracy - ref's
        return {s: r["final_accuracy"] - ref[s]["final_accuracy"] for s, r in rs.items() if s in ref}

    for c, agg in by_credit.items():
        mine = runs(c)
        step = min(r["curve"][-1][0] for r in [*mine.values(), *ref.values(), *top.values()])
        agg["best_oracle"] = best
        agg["efficiency_step"] = step
        agg["efficiency_updates"] = ratio_ci(gap(mine, step), gap(top, step))
        agg["efficiency_budget"] = ratio_ci(fin(mine), fin(top))


def _fmt(s: dict | None, scale: float = 1.0, digits: int = 1) -> str:
    if not s or s["mean"] is None or s["mean"] != s["mean"]:
        return "–"
    txt = f"{s['mean'] * scale:.{digits}f}"
    if s["n"] > 1:
        txt += f" ± {s['std'] * scale:.{digits}f} [±{s['ci95'] * scale:.{digits}f}]"
    return txt


def format_diff(d: dict | None, scale: float = 100.0) -> str:
    """A difference ``{"mean", "ci95"}`` as ``+x.x [±y.y]`` (points with the default ``scale``; "–" when missing)."""
    if not d or d["mean"] is None or d["mean"] != d["mean"]:
        return "–"
    ci = f" [±{d['ci95'] * scale:.1f}]" if d["ci95"] == d["ci95"] and d["ci95"] is not None else ""
    return f"{d['mean'] * scale:+.1f}{ci}"


def format_results_table(results: dict) -> str:
    """The results as a Markdown table (accuracies in points: mean ± std [95% CI half-width])."""
    ref_name = results["reference"]
    head = (f"| credit | held-out acc start → final | gain | Δ final vs {ref_name} | matched step "
            f"| acc @ matched (vs {ref_name}) | greedy final | steps | s/step | importance share "
            "| steps to ref | s to ref | grad norm | clipped | ESS | final entropy |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for c, a in results["credits"].items():
        matched = (f"{_fmt(a['matched_accuracy'], 100)} vs {_fmt(a['ref_matched_accuracy'], 100)}: "
                   f"{format_diff(a['matched_diff'])}" if "matched_step" in a else "–")
        lines.append(
            f"| {c} | {_fmt(a['start_accuracy'], 100)} → {_fmt(a['final_accuracy'], 100)} | {_fmt(a['gain'], 100)} "
            f"| {format_diff(a.get('final_diff'))} | {a.get('matched_step', '–')} | {matched} "
            f"| {_fmt(a['final_greedy'], 100)} | {_fmt(a['steps'], 1, 0)} | {_fmt(a['step_time'], 1, 2)} "
            f"| {_fmt(a['importance_share'], 100)}% | {_fmt(a['steps_to_ref'], 1, 0)} ({a['reached_ref']}) "
            f"| {_fmt(a['seconds_to_ref'], 1, 0)} | {_fmt(a['grad_norm'], 1, 2)} | {_fmt(a['grad_clipped'], 100, 0)}% "
            f"| {_fmt(a['ess_ratio'], 1, 2)} | {_fmt(a['final_entropy'], 1, 3)} |")
    ref = results["reference_final_accuracy"]
    headroom = format_headroom_table(results)
    over = ("(warm start, RL seed) units" if results.get("warm_seeds", 1) > 1 else "seeds")
    notes = [f"Held-out accuracy: sampled avg@k on fixed test problems, in points, mean ± std over {over} [95% CI "
             f"half-width]; Δ: difference of means vs {ref_name} [Welch 95% CI]; matched step: the fewest updates "
             f"any run of that credit or of {ref_name} made (accuracy interpolated between evaluations); "
             f"ref = {ref_name} final mean ({ref * 100:.1f})." if ref is not None else ""]
    return "\n".join(lines + [""] + notes) + "\n" + (f"\n{headroom}" if headroom else "")


def _fmt_ratio(e: dict | None) -> str:
    if not e or e["mean"] is None:
        return "–"
    ci = f" [{e['lo']:.2f}, {e['hi']:.2f}]" if e.get("lo") is not None else ""
    return f"{e['mean']:.2f}{ci}"


def _gain_diff(agg: dict, key: str) -> str:
    """`` Δ +x [±y]`` for a time to the gain whose difference to the reference exists (every run reached it)."""
    d = agg.get(f"{key}_diff")
    return "" if not d or d.get("mean") is None else f" Δ {format_diff(d, scale=1.0)}"


def format_headroom_table(results: dict) -> str:
    """The headroom metrics (``_add_headroom``) as a Markdown table; empty without a reference."""
    rows = [(c, a) for c, a in results["credits"].items() if "auc_updates" in a]
    if not rows:
        return ""
    ref = results["reference"]
    oracle = any("efficiency_updates" in a for _, a in rows)
    head = (f"| credit | mean acc over updates (Δ vs {ref}) | mean acc over seconds (Δ) | updates to "
            f"{GAIN_SHARE:.0%} of {ref}'s gain | seconds to it |" + (" credit efficiency, same updates | same budget |"
                                                                   if oracle else ""))
    lines = ["Headroom: " + ("credit efficiency = (credit − ref) / (best oracle − ref)." if oracle else ""),
             "", head, "|" + "---|" * (head.count("|") - 1)]
    for c, a in rows:
        cells = [c]
        for key in ("auc_updates", "auc_seconds"):
            cells.append(f"{_fmt(a[key], 100)} ({format_diff(a[f'{key}_diff'])})" if a[key] else "–")
        steps_d, seconds_d = (("", "") if c == ref else
                              (_gain_diff(a, "steps_to_gain"), _gain_diff(a, "seconds_to_gain")))
        cells += [f"{_fmt(a['steps_to_gain'], 1, 0)} ({a['reached_gain']}){steps_d}",
                  f"{_fmt(a['seconds_to_gain'], 1, 0)}{seconds_d}"]
        if oracle:
            cells += [f"{_fmt_ratio(a['efficiency_updates'])} @{a['efficiency_step']}",
                      _fmt_ratio(a["efficiency_budget"])]
        lines.append("| " + " | ".join(cells) + " |")
    best = next((a["best_oracle"] for _, a in rows if "best_oracle" in a), None)
    notes = [f"Mean accuracy over updates: the normalised area under held-out accuracy over the first `matched "
             f"step` updates; over seconds: over the training seconds both runs had; Δ: Welch 95% CI; updates and "
             f"seconds to reach {GAIN_SHARE:.0%} of {ref}'s mean final gain (interpolated; runs that reached it; "
             f"Δ [Welch 95% CI] only where every run of both reached it)."]
    if best:
        notes.append(f"Best oracle: {best}. Efficiency [95% paired bootstrap over seeds]: at the fewest updates any "
                     f"run of the credit, {ref} or {best} made (@step), and at the end of the budget; – where the "
                     f"oracle does not beat {ref}.")
    return "\n".join(lines + [""] + notes) + "\n"


def terminal_summary(results: dict):
    """The compact result for a terminal (a ``rich.table.Table``, fits 80 columns): per credit the final held-out
    accuracy ± 95% CI, the difference to the reference at equal training seconds (same budget) and at equal
    updates (``matched_step``), and seconds per step; with oracle columns, the credit efficiency at the same
    number of updates (the share of the best oracle's gain). Points of accuracy; CIs are half-widths."""
    from rich.table import Table

    ref = results["reference"]
    warm = results.get("warm_seeds", 1)
    units = results.get("seeds", 1) * warm
    over = f"{units} units" if warm > 1 else f"{units} seeds"
    oracle = any(a.get("efficiency_updates") for a in results["credits"].values())
    table = Table(title="held-out accuracy, points " + (f"(± 95% CI over {over})" if units > 1
                                                         else "(1 seed: no interval)"),
                  title_justify="left", box=None, pad_edge=False)
    for name in ("credit", "final acc", "Δ same budget", "Δ same updates", "s/step", *(("oracle",) if oracle else ())):
        table.add_column(name, justify="left" if name == "credit" else "right", no_wrap=True)
    for credit, a in results["credits"].items():
        acc = a["final_accuracy"]
        ci = f" ± {100 * acc['ci95']:.1f}" if acc["n"] > 1 and acc["ci95"] == acc["ci95"] else ""
        same_budget = format_diff(a.get("final_diff")) if credit != ref else "–"
        same_updates = (f"{format_diff(a['matched_diff'])} @{a['matched_step']}" if "matched_step" in a
                        and credit != ref else "–")
        share = (a.get("efficiency_updates") or {}).get("mean")
        table.add_row(credit, f"{100 * acc['mean']:.1f}{ci}", same_budget, same_updates,
                      f"{a['step_time']['mean']:.2f}",
                      *((f"{share:+.2f}" if share is not None and credit != ref else "–",) if oracle else ()))
    table.caption = (f"Δ: difference of means vs {ref} [Welch 95% CI]; same updates: at the fewest steps any run of "
                     "the pair made (@step)" + (f"; oracle: share of the best oracle's gain, (credit − {ref}) / "
                                                f"(oracle − {ref}), at the same updates" if oracle else "")
                     + ("; a unit: a (warm start, RL seed) pair" if warm > 1 else "") + ". Full table: results.md.")
    table.caption_justify = "left"
    return table


def print_summary(results: dict, out_dir: str | Path, console=None) -> None:
    """What ``oar compare`` prints at the end: :func:`terminal_summary`, the wall time and the written files."""
    from rich.console import Console

    console = console or Console()
    console.print()
    console.print(terminal_summary(results))
    out = Path(out_dir)
    console.print(f"\nwarm start and runs: {results['wall_seconds'] / 60:.1f} min; wrote", highlight=False)
    for name, what in (("results.md", "the full results table"), ("results.json", "every number, per run"),
                       ("report.md", "key figures and every metric's curve")):
        if (out / name).is_file():
            console.print(f"  {out / name}  ({what})", highlight=False, soft_wrap=True)
