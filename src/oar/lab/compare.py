"""``oar compare``: GRPO and OAR trained side by side on the lab under the same budget and seeds.

:func:`base_config` builds the :class:`RunConfig` every run starts from (preset < regime < overrides);
:func:`compare` trains every (column, seed) run from it and writes ``results.json``, ``results.md`` and
``report.md`` next to the run directories. Each run is one single-thread process: on this machine's worker
pool (:mod:`oar.lab.pool`, ``workers`` at a time) or as a Ray task (:mod:`oar.lab.ray_pool`); every run of a
seed starts from the same warm start, built once here, and draws the same prompts.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from oar.credit import CreditSpec, import_modules
from oar.files import atomic_write, check_writable_dir, strict_json
from oar.lab.lm import LABS, LM_PROTOCOL, LM_QUICK, LM_QUICK_WARM_STEPS, LM_RECIPE, LMWarmStartConfig, lm_warm_start
from oar.lab.pool import Job, run_local
from oar.lab.ray_pool import RayOptions
from oar.lab.run import RunConfig, credit_defaults
from oar.lab.summary import format_results_table, summarize_comparison
from oar.lab.task import TaskConfig, recorded_task
from oar.lab.warmstart import WarmStartConfig, warm_start
from oar.progress import RunTable
from oar.quiet import quiet_libraries
from oar.rundir import RunDir, run_dir_name

WARM_START_ROW, REPORT_ROW = "warm start (SFT)", "results and report"
DEFAULT_WORKERS = 2  # the local pool: one run per core of a 2-core machine


@dataclass(frozen=True, kw_only=True)
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
    "quick": ComparePreset(credits=("grpo", "oar-g"), seeds=1, budget_s=30.0, eval_every=10, eval_problems=64,
                           eval_k=2, warm_steps=250, smoke=True),
    "default": ComparePreset(credits=("grpo", "oar-g"), seeds=2, budget_s=240.0, eval_every=20, eval_problems=256,
                             eval_k=4),
    "study": ComparePreset(credits=("grpo", "oar-g", "oar-p"), seeds=6, budget_s=300.0, eval_every=30,
                           eval_problems=512, eval_k=4),
}


def get_preset(name: str) -> ComparePreset:
    """The preset ``name``; ValueError naming the presets."""
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {name!r}")
    return PRESETS[name]


class RunsFailed(RuntimeError):
    """Runs of a study that failed every attempt (``oar compare --backend ray``). ``failed``: run name -> the
    description of each attempt's failure; ``results``: what the finished runs gave (written), or None."""

    def __init__(self, failed: dict[str, list[str]], results: dict | None, out: Path) -> None:
        self.failed, self.results = failed, results
        runs = "; ".join(f"{name} ({len(errs)} attempts, last: {errs[-1]})" for name, errs in failed.items())
        kept = f"the results of the other runs are in {out}; " if results else ""
        super().__init__(f"{len(failed)} run(s) failed every attempt: {runs}; {kept}--resume trains only the runs "
                         "that did not finish")


# seeds per credit at most: each seed is one run of budget_s training seconds per credit (the study runs 6; 1000
# runs of the quick preset's 30 s are 8.3 hours per credit and worker), and the seeds' run names are built up front
MAX_SEEDS = 1000
# what a comparison writes into its output directory next to the run directories
RESULT_FILES, RESULT_DIRS = ("results.json", "results.md", "report.md"), ("figures", "plots")


def check_out_dir(out_dir: str | Path, run_names: list[str]) -> Path:
    """``out_dir`` created and writable, no file where a run directory (``run_names``) or a results directory
    goes, no directory where a results file goes; ValueError naming the first such path, before any work."""
    out = check_writable_dir(out_dir)
    for name in (*run_names, *RESULT_DIRS):
        if (out / name).exists() and not (out / name).is_dir():
            raise ValueError(f"{str(out / name)!r} is a file, where oar compare writes a directory; move it away "
                             "or choose another --out")
    for name in RESULT_FILES:
        if (out / name).is_dir():
            raise ValueError(f"{str(out / name)!r} is a directory, where oar compare writes its {name}; move it "
                             "away or choose another --out")
    return out


def finished_run(run_dir: str | Path, cfg: RunConfig) -> bool:
    """Whether ``run_dir`` holds a completed lab run trained with exactly ``cfg``, proven by its own
    ``metrics.jsonl``: the last record is the held-out evaluation taken when training stopped (``budget_s``
    spent or ``max_steps`` reached), and ``summary.json`` names that same final evaluation. A ``summary.json``
    left over from an earlier run in the same directory proves nothing (the rerun restarted the metrics)."""
    run = RunDir(run_dir)
    try:
        meta, summary, rows = run.meta(), run.summary(), run.metrics()
    except (OSError, ValueError):
        return False
    if _lab_key(meta.get("lab")) != _lab_key(json.loads(json.dumps(asdict(cfg)))) \
            or not _same_defaults(meta.get("credit_defaults"), credit_defaults(cfg)) or not rows \
            or "eval/accuracy" not in rows[-1]:
        return False
    last = rows[-1]
    stopped = last.get("wall_time", 0.0) >= cfg.budget_s or last.get("step", 0) >= cfg.max_steps
    return stopped and isinstance(summary, dict) and summary.get("final") == last


def _same_defaults(recorded: dict | None, current: dict) -> bool:
    """Whether a run's recorded credit option defaults are today's. An option registered after the run (absent from
    its record, e.g. the importance credits' ``rule`` and its parameters) counts as at its default: a new option's
    default is the behaviour before it (docs/credits.md)."""
    return isinstance(recorded, dict) and set(recorded) <= set(current) \
        and all(current[k] == v for k, v in recorded.items())


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


def credit_columns(credits: Sequence[str]) -> dict[str, CreditSpec]:
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


_RUN_FIELDS = frozenset(f.name for f in fields(RunConfig))
_TASK_FIELDS = frozenset(f.name for f in fields(TaskConfig))


def _check_keys(what: str, keys, allowed: frozenset[str]) -> None:
    unknown = sorted(set(keys) - allowed)
    if unknown:
        raise ValueError(f"{what}: unknown field(s) {', '.join(map(repr, unknown))}; "
                         f"fields: {', '.join(sorted(allowed))}")


def base_config(preset: ComparePreset, regime: str | None = None, overrides: Mapping | None = None,
                lab: str = "char") -> RunConfig:
    """The :class:`RunConfig` every run of a comparison starts from (credit and seed still to set).

    In order of precedence: the preset's budget and evaluation; the regime's task, recipe and (unless the preset
    is a smoke one) protocol; ``overrides``, :class:`RunConfig` fields, of which ``warm`` (a
    :class:`WarmStartConfig`) replaces the preset's warm start before the regime's task applies to it, and
    ``task`` (a dict of :class:`oar.lab.task.TaskConfig` fields, e.g. ``{"verbosity": 0}``) applies after it.
    ``lab``: ``"char"`` (the character lab) or a pretrained LM (:data:`oar.lab.lm.LM_MODELS`: the language-model
    lab), whose own warm start, recipe and protocol (:data:`oar.lab.lm.LM_RECIPE`, ``LM_PROTOCOL``; ``LM_QUICK``
    under a smoke preset) replace the preset's and the regime's: a regime gives it its task only.
    ValueError naming a bad lab, regime, field or value."""
    if lab not in LABS:
        raise ValueError(f"lab must be one of {LABS}, got {lab!r}")
    overrides = dict(overrides or {})
    task = overrides.pop("task", {})
    _check_keys("overrides", overrides, _RUN_FIELDS)
    _check_keys("task overrides", task, _TASK_FIELDS)
    p = preset
    warm = overrides.pop("warm", None) or (WarmStartConfig(steps=p.warm_steps) if p.warm_steps else WarmStartConfig())
    run = {"budget_s": p.budget_s, "eval_every": p.eval_every, "eval_problems": p.eval_problems,
           "eval_k": p.eval_k, **p.run}
    if regime is not None:
        from oar.lab.regimes import get_regime

        warm = replace(warm, task=replace(warm.task, **get_regime(regime).task))  # ValueError naming the regimes
        if lab == "char":
            run.update(get_regime(regime).recipe)
            if not p.smoke:
                run.update(get_regime(regime).protocol)
    if lab != "char":
        if not isinstance(warm, LMWarmStartConfig):
            warm = LMWarmStartConfig(model=lab, task=warm.task,
                                     **({"steps": LM_QUICK_WARM_STEPS} if p.smoke else {}))
        run.update({**LM_RECIPE, **(LM_QUICK if p.smoke else LM_PROTOCOL)})
    if task:
        warm = replace(warm, task=replace(warm.task, **task))
    return RunConfig(warm=warm, **{**run, **overrides})


def run_name(column: str, warm_seed: int, seed: int) -> str:
    """The run directory of ``column``'s run from warm start ``warm_seed`` with RL seed ``seed``."""
    return run_dir_name(column if warm_seed == 0 else f"{column}-w{warm_seed}", seed)


def run_config(base: RunConfig, column: str, seed: int) -> RunConfig:
    """The configuration of the run of comparison column ``column`` (a credit, with its options) and ``seed``."""
    return replace(base, credit=column, seed=seed)


def compare(
    out: str | Path, base: RunConfig, columns: Sequence[str], *, seeds: int, workers: int | None = None,
    resume: bool = False, progress: bool = True, verbose: bool = False, imports: Sequence[str] = (),
    cache_dir: str | Path | None = None, report: bool = True, ray: RayOptions | None = None, warm_seeds: int = 1,
) -> dict:
    """Train every (column, seed) run from ``base`` (:func:`base_config`) into ``out/COLUMN-sSEED`` and write
    the results.

    ``columns``: credit columns (``grpo``, ``oar-g@beta=2``, ...), each checked before any work; the first
    column that does not act (plain GRPO), else the first, is the reference. ``seeds``: seeds 0..seeds-1 per column.
    ``workers``: runs at a time (local pool: default 2; Ray: default as many as the cluster takes).
    ``resume``: keep the finished runs already in ``out`` whose configuration is the one this call would run
    (an interrupted comparison continues where it stopped, on either backend); every other run is trained.
    ``progress``: draw the live table (warm start, then one line per run; :class:`oar.progress.RunTable`).
    ``verbose``: keep the libraries' own warnings, logs and progress bars (:func:`oar.quiet.quiet_libraries`),
    and Ray's.
    ``imports``: modules registering credit methods (``--import``), imported here and in every worker.
    ``cache_dir``: the warm-start cache (default ``oar.cache``'s). ``report``: also write ``report.md``.
    ``ray``: run every run as a Ray task (:class:`oar.lab.ray_pool.RayOptions`); None: the local pool.
    ``warm_seeds``: warm starts 0..warm_seeds-1 (``base.warm`` with that ``seed``, each built once and cached);
    every column runs ``seeds`` RL seeds from each, and a (warm start, RL seed) pair is the unit every interval is
    over. Warm start 0's runs keep their names (``COLUMN-sSEED``), the others' are ``COLUMN-wW-sSEED``.

    Returns the results object (also in ``out/results.json``; table in ``out/results.md``). Raises
    :class:`RunsFailed` (after writing the results of the other runs) when a Ray run failed every attempt.
    """
    imports = tuple(imports)
    import_modules(imports)  # before the columns: a credit they register is known, an unknown one errors now
    specs = credit_columns(columns)  # ValueError naming the bad one
    keys = list(specs)
    if not keys:
        raise ValueError("no credit columns to compare")
    if not 1 <= seeds <= MAX_SEEDS:
        raise ValueError(f"seeds must be between 1 and {MAX_SEEDS}, got {seeds}")
    if not 1 <= warm_seeds <= MAX_SEEDS:
        raise ValueError(f"warm_seeds must be between 1 and {MAX_SEEDS}, got {warm_seeds}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if ray is not None:
        ray.check()
    # absolute: the same path in run.json on every backend and node; every path it writes checked before any work
    out = check_out_dir(Path(out).resolve(), [run_name(c, w, seed) for w in range(warm_seeds) for seed in range(seeds)
                                                for c in keys])
    from rich.live import Live

    reference = next((c for c, spec in specs.items() if not spec.resolve().method.acts), keys[0])  # plain GRPO
    # Live re-draws the view 4 times a second and leaves its last state on the screen
    with quiet_libraries(verbose), (Live(refresh_per_second=4) if progress else contextlib.nullcontext()) as live:
        return _compare(out, base, keys, seeds, workers, cache_dir, report, resume, live, verbose, imports, ray,
                        reference, warm_seeds)


def _compare(out: Path, base: RunConfig, columns: list[str], seeds: int, workers: int | None, cache_dir,
             report: bool, resume: bool, live, verbose: bool, imports: tuple[str, ...],
             ray: RayOptions | None, reference: str, warm_seeds: int = 1) -> dict:
    """The body of :func:`compare` (arguments checked), drawing into ``live`` (a ``rich.live.Live`` or None);
    ``reference``: the column the others are compared with (the one that does not act, plain GRPO, if any)."""
    t0 = time.perf_counter()
    units = [(w, seed) for w in range(warm_seeds) for seed in range(seeds)]  # unit-major: a unit's credits together
    names = [run_name(c, w, seed) for w, seed in units for c in columns]
    session, limit = contextlib.nullcontext(), workers  # limit: runs in flight (Ray: None, the cluster decides)
    if ray is None:
        workers = limit = workers or DEFAULT_WORKERS
        title = f"oar compare: {len(names)} runs, {workers} at a time"
    else:
        from oar.lab.ray_pool import cluster_cpus, ray_session

        session = ray_session(ray, workers, verbose, imports)
    with session:
        if ray is not None:
            workers = min(limit or len(names), cluster_cpus())  # at a time now, for the table and its ETA
            title = f"oar compare on Ray: {len(names)} runs, {workers} at a time"
        view = RunTable(names, workers, title=title, before=(WARM_START_ROW,), after=(REPORT_ROW,))
        if live is not None:
            live.update(view)
        t_warm = time.perf_counter()
        build = lm_warm_start if isinstance(base.warm, LMWarmStartConfig) else warm_start
        warms, warm_paths = [replace(base.warm, seed=w) for w in range(warm_seeds)], []
        for w, warm in enumerate(warms):  # once each, before the workers (they load the cache)
            view.update(WARM_START_ROW, status="running", note="loading" + (f" (seed {w})" if warm_seeds > 1 else ""))
            warm_paths.append(build(warm, cache_dir, report=lambda **f: view.update(WARM_START_ROW, **f))[2])
        warm_path, warm_s = warm_paths[0], time.perf_counter() - t_warm
        cached = view.rows[WARM_START_ROW].step == 0
        view.update(WARM_START_ROW, status="cached" if cached else "done",
                    note=f"key {warm_path.name}" if cached else f"{view.rows[WARM_START_ROW].note}, {warm_s:.0f} s")
        jobs, dirs = [], {}
        for w, seed in units:
            for c in columns:
                cfg = replace(run_config(base, c, seed), warm=warms[w])
                run_dir = out / run_name(c, w, seed)
                dirs[(c, seed if warm_seeds == 1 else f"w{w}-s{seed}")] = run_dir
                if resume and finished_run(run_dir, cfg):
                    view.update(run_dir.name, status="cached", note="kept (--resume)")
                else:
                    jobs.append(Job(cfg, str(run_dir), str(cache_dir) if cache_dir else None))
        if ray is None:
            run_local(jobs, workers, view, verbose, imports)
            errors = {}
        else:
            from oar.lab.ray_pool import run_ray

            errors = {}
            for w, path in enumerate(warm_paths):  # one warm start shipped per batch of its runs
                mine = [j for j in jobs if j.cfg.warm == warms[w]]
                errors.update(run_ray(mine, view, path, ray, limit, verbose, imports) if mine else {})
    failed = {name: errs for name, errs in errors.items() if len(errs) > ray.retries} if ray else {}
    dirs = {k: d for k, d in dirs.items() if d.name not in failed}
    if not dirs:
        raise RunsFailed(failed, None, out)
    view.update(REPORT_ROW, status="running", note="results.json, results.md, report.md")
    credits = list(dict.fromkeys(c for c, _ in dirs))
    results = summarize_comparison(dirs, reference=reference if reference in credits else credits[0])
    results.update({"warm_start": str(warm_path), "warm_starts": [str(p) for p in warm_paths],
                    "warm_seeds": warm_seeds, "warm_start_seconds": warm_s,
                    "wall_seconds": time.perf_counter() - t0, "config": asdict(base), "seeds": seeds,
                    "workers": workers, "backend": "ray" if ray else "local",
                    "errors": {name: errs for name, errs in errors.items() if errs}})
    table = format_results_table(results)
    try:
        atomic_write(out / "results.json", strict_json(results))
        atomic_write(out / "results.md", table)
        if report:
            from oar.viz.report import write_report

            write_report([str(d) for d in dirs.values()], out, results_md=table)
    except OSError as err:  # the runs are kept: --resume summarizes them without training again
        raise ValueError(f"cannot write the results into {str(out)!r} ({err.strerror or err}: "
                         f"{err.filename or ''}); the runs are kept, rerun with --resume once it is writable") from err
    view.update(REPORT_ROW, status="done")
    if failed:
        raise RunsFailed(failed, results, out)
    return results
