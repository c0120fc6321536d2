"""``oar compare``: GRPO and OAR trained side by side on the lab under the same budget and seeds.

Each (credit, seed) run is one single-thread process (``workers`` at a time, one per core); every run of a
seed starts from the same cached warm start and draws the same prompts. Writes ``results.json`` and
``results.md`` next to the run directories.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing as mp
import multiprocessing.queues
import queue
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from oar.credit import CreditSpec, import_modules
from oar.files import atomic_write, read_jsonl
from oar.lab.lm import LABS, LM_PROTOCOL, LM_QUICK, LM_QUICK_WARM_STEPS, LM_RECIPE, LMWarmStartConfig, lm_warm_start
from oar.lab.run import RunConfig, credit_defaults, train_lab
from oar.lab.summary import format_results_table, summarize_comparison
from oar.lab.task import recorded_task
from oar.lab.warmstart import WarmStartConfig, warm_start
from oar.progress import RunTable
from oar.quiet import quiet_libraries

WARM_START_ROW, REPORT_ROW = "warm start (SFT)", "results and report"


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
    smoke: bool = False  # keeps its own budget and evaluation under a regime that carries a study's protocol


PRESETS: dict[str, ComparePreset] = {
    "quick": ComparePreset(("grpo", "oar-g"), 1, 30.0, 10, 64, 2, warm_steps=250, smoke=True),
    "default": ComparePreset(("grpo", "oar-g"), 2, 240.0, 20, 256, 4),
    "study": ComparePreset(("grpo", "oar-g", "oar-p"), 6, 300.0, 30, 512, 4),
}


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
    if _lab_key(meta.get("lab")) != _lab_key(json.loads(json.dumps(asdict(cfg)))) \
            or meta.get("credit_defaults") != credit_defaults(cfg) or not rows or "eval/accuracy" not in rows[-1]:
        return False
    last = rows[-1]
    stopped = last.get("wall_time", 0.0) >= cfg.budget_s or last.get("step", 0) >= cfg.max_steps
    return stopped and isinstance(summary, dict) and summary.get("final") == last


def _lab_key(lab: dict | None) -> dict | None:
    """A run's recorded ``RunConfig`` as compared on ``--resume``: its credit as one value (an older oar kept a
    column's options in ``oar.credit_options``; folded into ``credit`` here) and its task without the knobs added
    later at their defaults (:func:`oar.lab.task.recorded_task`), so an older oar's finished runs still count."""
    if not isinstance(lab, dict):
        return lab
    warm = lab.get("warm")
    if isinstance(warm, dict) and isinstance(warm.get("task"), dict):  # knobs added later, at their defaults
        lab = {**lab, "warm": {**warm, "task": recorded_task(warm["task"])}}
    if not (lab.get("oar") or {}).get("credit_options"):
        return lab
    oar = dict(lab["oar"])
    options = oar.pop("credit_options")
    return {**lab, "credit": str(CreditSpec.parse(lab["credit"]).merged(options, "oar.credit_options")), "oar": oar}


def credit_columns(credits: tuple[str, ...]) -> dict[str, CreditSpec]:
    """Each comparison column ``NAME`` or ``NAME@OPT=VALUE&...`` by its canonical text (its run directories'
    name; a column given twice counts once), resolved to check it; ValueError naming an unknown credit or
    option, a refused value or combination, or a column that cannot name a directory."""
    columns: dict[str, CreditSpec] = {}
    for text in credits:
        spec = CreditSpec.parse(text)
        name = str(spec)
        if "/" in name or "\\" in name or ".." in name:  # the column names its run directories
            raise ValueError(f"credit column {text!r} must not contain '/', '\\' or '..'")
        spec.resolve()
        columns[name] = spec
    return columns


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


def worker_pool(workers: int, events=None, verbose: bool = False,
                imports: tuple[str, ...] = ()) -> ProcessPoolExecutor:
    """``workers`` spawned processes that exit when this process dies (see :func:`_die_with_parent`), send
    their progress reports to ``events`` (see :func:`_init_worker`) and first import ``imports`` (modules that
    register credit methods: a spawned process starts with the built-ins only)."""
    import os

    return ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init_pool_worker,
                               initargs=(os.getpid(), events, verbose, tuple(imports)))


# set in each worker by _init_worker: where progress reports go, and whether library noise stays
_EVENTS: queue.SimpleQueue | mp.queues.Queue | None = None
_VERBOSE = False


def _init_worker(events, verbose: bool) -> None:
    global _EVENTS, _VERBOSE
    _EVENTS, _VERBOSE = events, verbose


def _init_pool_worker(parent: int, events, verbose: bool, imports: tuple[str, ...] = ()) -> None:
    _die_with_parent(parent)
    import_modules(imports)
    _init_worker(events, verbose)


def _job(args: tuple[RunConfig, str, str | None]) -> dict:
    import torch

    torch.set_num_threads(1)
    cfg, run_dir, cache_dir = args
    name = Path(run_dir).name

    def report(**fields) -> None:
        if _EVENTS is not None:
            _EVENTS.put({"run": name, **fields})

    report(status="running", note="")
    try:
        with quiet_libraries(_VERBOSE):
            summary = train_lab(cfg, run_dir, cache_dir, report=report)
    except BaseException:
        report(status="failed")
        raise
    report(status="done", accuracy=summary["final"]["eval/accuracy"])
    return summary


def base_config(preset: str = "default", budget_s: float | None = None, verbosity: int | None = None,
                warm: WarmStartConfig | LMWarmStartConfig | None = None, run_overrides: dict | None = None,
                regime: str | None = None, lab: str = "char") -> RunConfig:
    """The :class:`RunConfig` every run of a comparison starts from (credit and seed still to set): the preset's
    budget and evaluation, then the regime's task and recipe (and its protocol unless the preset is a smoke one),
    ``verbosity``, ``run_overrides`` and ``budget_s``, in that order of precedence. ``lab``: ``"char"`` (the
    character lab) or a pretrained LM (:data:`oar.lab.lm.LM_MODELS`), whose own recipe and protocol replace the
    preset's and the regime's (a regime gives it its task only). ValueError naming a bad preset, lab, regime or
    field value."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {preset!r}")
    if lab not in LABS:
        raise ValueError(f"lab must be one of {LABS}, got {lab!r}")
    p = PRESETS[preset]
    warm = warm or (WarmStartConfig(steps=p.warm_steps) if p.warm_steps else WarmStartConfig())
    fields = {"budget_s": p.budget_s, "eval_every": p.eval_every, "eval_problems": p.eval_problems,
              "eval_k": p.eval_k, **p.run}
    if regime is not None:
        from oar.lab.regimes import get_regime

        warm = replace(warm, task=replace(warm.task, **get_regime(regime).task))  # ValueError naming the regimes
        if lab == "char":
            fields.update(get_regime(regime).recipe)
            if not p.smoke:
                fields.update(get_regime(regime).protocol)
    if lab != "char" and not isinstance(warm, LMWarmStartConfig):
        warm = LMWarmStartConfig(model=lab, task=warm.task, **({"steps": LM_QUICK_WARM_STEPS} if p.smoke else {}))
    if lab != "char":
        fields.update(LM_RECIPE)
        fields.update(LM_QUICK if p.smoke else LM_PROTOCOL)
    if verbosity is not None:
        warm = replace(warm, task=replace(warm.task, verbosity=verbosity))
    fields.update(run_overrides or {})
    if budget_s is not None:
        fields["budget_s"] = budget_s
    return RunConfig(warm=warm, **fields)


def compare(
    out_dir: str | Path, preset: str = "default", credits: tuple[str, ...] | None = None,
    seeds: int | None = None, budget_s: float | None = None, verbosity: int | None = None, workers: int = 2,
    warm: WarmStartConfig | None = None, cache_dir: str | Path | None = None, report: bool = True,
    run_overrides: dict | None = None, resume: bool = False, regime: str | None = None, progress: bool = True,
    verbose: bool = False, imports: tuple[str, ...] = (), lab: str = "char",
) -> dict:
    """Run every (credit, seed) of ``preset`` (overridden by the arguments) and write the results.

    ``run_overrides``: extra :class:`RunConfig` fields applied to every run (e.g. ``{"lr": 3e-4}``).
    ``regime``: a regime of :data:`oar.lab.regimes.REGIMES`: its task overrides (applied before ``verbosity``),
    its recipe (batch shape, lr) and, except under a smoke preset (``quick``), its protocol (budget, evaluation).
    Precedence: preset < regime < ``run_overrides`` < ``budget_s``.
    ``resume``: keep the finished runs already in ``out_dir`` whose configuration is the one this call would
    run (an interrupted comparison continues where it stopped); every other run is trained from the start.
    ``progress``: draw the live table (warm start, then one line per run; :class:`oar.progress.RunTable`).
    ``verbose``: keep the libraries' own warnings, logs and progress bars (:func:`oar.quiet.quiet_libraries`).
    ``imports``: modules registering credit methods (``--import``), imported here and in every worker.
    ``lab``: ``"char"`` or a pretrained LM (``"smollm2"``: the language-model lab, :mod:`oar.lab.lm`).

    Returns the results object (also in ``out_dir/results.json``; table in ``out_dir/results.md``).
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {preset!r}")
    p = PRESETS[preset]
    imports = tuple(imports)
    import_modules(imports)  # before the columns: a credit they register is known, an unknown one errors now
    columns = credit_columns(tuple(credits or p.credits))  # ValueError naming the bad one
    seeds = p.seeds if seeds is None else seeds
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    base = base_config(preset, budget_s=budget_s, verbosity=verbosity, warm=warm, run_overrides=run_overrides,
                       regime=regime, lab=lab)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from rich.live import Live

    # Live re-draws the view 4 times a second and leaves its last state on the screen
    with quiet_libraries(verbose), (Live(refresh_per_second=4) if progress else contextlib.nullcontext()) as live:
        return _compare(out, preset, base, columns, seeds, workers, cache_dir, report, resume, live, verbose,
                        imports)


def _compare(out: Path, preset: str, base: RunConfig, columns: dict[str, CreditSpec], seeds: int,
             workers: int, cache_dir, report: bool, resume: bool, live, verbose: bool,
             imports: tuple[str, ...] = ()) -> dict:
    """The body of :func:`compare` (arguments checked), drawing into ``live`` (a ``rich.live.Live`` or None);
    ``columns``: column name -> its credit (:func:`credit_columns`)."""
    warm, credits = base.warm, tuple(columns)
    names = [f"{c}-s{seed}" for seed in range(seeds) for c in credits]
    view = RunTable(names, workers, title=f"oar compare: {len(names)} runs, {workers} at a time",
                    before=(WARM_START_ROW,), after=(REPORT_ROW,))
    if live is not None:
        live.update(view)
    t0 = time.perf_counter()
    view.update(WARM_START_ROW, status="running", note="loading")
    build = lm_warm_start if isinstance(warm, LMWarmStartConfig) else warm_start
    _, _, warm_path = build(warm, cache_dir, report=lambda **f: view.update(WARM_START_ROW, **f))
    warm_s = time.perf_counter() - t0  # once, before the workers (they load the cache)
    cached = view.rows[WARM_START_ROW].step == 0
    view.update(WARM_START_ROW, status="cached" if cached else "done",
                note=f"key {warm_path.name}" if cached else f"{view.rows[WARM_START_ROW].note}, {warm_s:.0f} s")
    jobs, dirs = [], {}
    for seed in range(seeds):  # seed-major: the credits of one seed run side by side on the cores
        for c in credits:
            cfg = replace(base, credit=c, seed=seed)
            run_dir = out / f"{c}-s{seed}"
            dirs[(c, seed)] = run_dir
            if not (resume and finished_run(run_dir, cfg)):
                jobs.append((cfg, str(run_dir), str(cache_dir) if cache_dir else None))
            else:
                view.update(run_dir.name, status="cached", note="kept (--resume)")
    _run_jobs(jobs, workers, view, verbose, imports)
    view.update(REPORT_ROW, status="running", note="results.json, results.md, report.md")
    plain = [c for c, spec in columns.items() if not spec.resolve().method.acts]  # plain GRPO, if compared
    results = summarize_comparison(dirs, reference=(plain or credits)[0])
    results.update({"preset": preset, "warm_start": str(warm_path), "warm_start_seconds": warm_s,
                    "wall_seconds": time.perf_counter() - t0, "config": asdict(base), "seeds": seeds,
                    "workers": workers})
    atomic_write(out / "results.json", json.dumps(_finite(results), indent=1, allow_nan=False))
    table = format_results_table(results)
    atomic_write(out / "results.md", table)
    if report:
        from oar.viz.report import write_report

        write_report([str(d) for d in dirs.values()], out, results_md=table)
    view.update(REPORT_ROW, status="done")
    return results


def _drain(events, view: RunTable) -> None:
    """Fold progress reports into ``view`` until the ``None`` sentinel."""
    while (event := events.get()) is not None:
        view.update(**event)


def _run_jobs(jobs: list, workers: int, view: RunTable, verbose: bool = False,
              imports: tuple[str, ...] = ()) -> None:
    events = mp.get_context("spawn").Queue() if workers > 1 else queue.SimpleQueue()
    drain = threading.Thread(target=_drain, args=(events, view), daemon=True)
    drain.start()
    for _, run_dir, _ in jobs[:workers]:  # a worker takes a while to import torch and TRL
        view.update(Path(run_dir).name, status="starting", note="loading torch and TRL")
    try:
        if workers == 1:
            _init_worker(events, verbose)
            try:
                for j in jobs:
                    _job(j)
            finally:
                _init_worker(None, False)
            return
        with worker_pool(workers, events, verbose, imports) as pool:
            for _ in pool.map(_job, jobs):
                pass
    finally:
        events.put(None)
        drain.join(timeout=10)
        if isinstance(events, mp.queues.Queue):
            events.close()
            events.join_thread()
