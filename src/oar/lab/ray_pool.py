"""``oar compare --backend ray``: every run a Ray task on a cluster (``oar[ray]``), gathered into the same run
directories as the local pool (:mod:`oar.lab.pool`).

What travels (docs/scaling.md, "A study on a Ray cluster"):
- **code**: this process's ``oar`` package and the top-level packages of ``--import`` modules, uploaded once with
  the job (Ray's ``py_modules``), so every node runs the driver's code; the nodes need oar's dependencies only;
- **the warm start**: built (or loaded from the cache) once, here; its files (1.2 MB for the default model) are
  put into Ray's object store once, and a task installs them into its node's warm-start cache unless that holds
  them already;
- **the results**: a task sends its run directory's files back and this process writes them under ``--out``,
  so no shared filesystem is needed. A task trains into the same absolute path on its node (``--out`` must be
  a path every node can create; on one machine, or with a shared filesystem, it is the same directory).

One task per run, with one CPU (and ``gpus_per_run`` GPUs where asked); Ray's own retries are off: a task that
raises or whose worker or node dies is submitted again up to ``retries`` times, each failure shown in the live
table and recorded; a run that fails every attempt is reported by :func:`run_ray`'s caller, never dropped.
Progress reports go to a small actor that this process drains twice a second into the live table. Imports Ray
only inside functions: oar imports without it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from oar.files import atomic_write
from oar.lab.pool import Job, run_job
from oar.rundir import RunDir

INSTALL_HINT = "pip install 'oar-rl[ray]'"


@dataclass(frozen=True, kw_only=True)
class RayOptions:
    """How ``oar compare`` uses Ray. ``address``: the cluster to join (``ray.init(address=...)``); None: the
    cluster named by ``RAY_ADDRESS`` if set, else a new local Ray instance with ``workers`` CPUs (all of them
    when ``workers`` is None). ``retries``: attempts after a run's first failure. ``gpus_per_run``: GPUs each
    task reserves (Ray sets its ``CUDA_VISIBLE_DEVICES``; the arithmetic lab itself trains on the CPU)."""

    address: str | None = None
    retries: int = 2
    gpus_per_run: float = 0.0

    def check(self) -> None:
        """ValueError naming a bad value, or saying that Ray is not installed."""
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.gpus_per_run < 0:
            raise ValueError(f"gpus_per_run must be >= 0, got {self.gpus_per_run}")
        if importlib.util.find_spec("ray") is None:
            raise ValueError(f"--backend ray needs Ray, which is not installed: {INSTALL_HINT}")


@contextlib.contextmanager
def ray_session(options: RayOptions, workers: int | None, verbose: bool = False,
                imports: tuple[str, ...] = ()) -> Iterator[None]:
    """Ray initialised for the block: the caller's session when this process has one (left running; its
    workers must import ``oar`` and ``imports`` by themselves), else a new connection (``options.address`` or
    ``RAY_ADDRESS``) or local instance that ships this process's code (:func:`runtime_env`), shut down on
    leaving. Ray's logs and the workers' output stay out of the terminal unless ``verbose``."""
    import ray

    if ray.is_initialized():
        yield
        return
    quiet = {} if verbose else {"logging_level": logging.ERROR, "log_to_driver": False}
    env = runtime_env(imports)
    if options.address is None and not os.environ.get("RAY_ADDRESS"):
        start_local_ray(num_cpus=workers, runtime_env=env, **quiet)
    else:
        ray.init(address=options.address, runtime_env=env, **quiet)
    try:
        yield
    finally:
        ray.shutdown()


def start_local_ray(attempts: int = 3, **init) -> None:
    """``ray.init(address="local", include_dashboard=False, **init)``, tried up to ``attempts`` times: Ray gives a
    new local node 30 s to register (a fixed limit), which a heavily loaded machine can miss."""
    import ray

    for attempt in range(attempts):
        try:
            ray.init(address="local", include_dashboard=False, **init)
            return
        except Exception as err:  # Ray raises a bare Exception for it
            if "timed out during startup" not in str(err) or attempt == attempts - 1:
                raise
            ray.shutdown()


def runtime_env(imports: tuple[str, ...] = ()) -> dict:
    """The job's Ray runtime environment: this process's ``oar`` package and the top-level packages (or
    single-file modules) of ``imports``, uploaded once and put first on every worker's path, so every node
    runs the driver's code; one thread per run."""
    tops = [importlib.import_module(top) for top in dict.fromkeys(n.partition(".")[0] for n in ("oar", *imports))]
    return {"py_modules": [m.__path__[0] if hasattr(m, "__path__") else m.__file__ for m in tops],
            "excludes": ["__pycache__", "*.pyc"],
            "env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}}


def cluster_cpus() -> int:
    """CPUs of the Ray cluster this process is connected to (at least 1)."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


class _EventLog:
    """A Ray actor: progress reports of the tasks, taken in batches by the driver."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def put(self, event: dict) -> None:
        self.events.append(event)

    def take(self) -> list[dict]:
        events, self.events = self.events, []
        return events


def _ray_task(job: Job, attempt: int, warm_files: dict[str, bytes], events, verbose: bool,
              imports: tuple[str, ...]) -> tuple[dict, dict[str, bytes]]:
    """One run in a Ray worker: the credit modules imported, the warm start installed into this node's cache,
    then :func:`oar.lab.pool.run_job`; returns its summary and its run directory's files."""
    from oar.credit import import_modules
    from oar.lab.warmstart import install_warm_start

    import_modules(imports)
    install_warm_start(job.cfg.warm, warm_files, job.cache_dir)

    def report(**fields) -> None:  # fire and forget: a step never waits for the driver
        events.put.remote({"run": job.name, "attempt": attempt, **fields})

    summary = run_job(job, report, verbose)
    return summary, RunDir(job.run_dir).files()


def _write_run(run_dir: str, files: dict[str, bytes]) -> None:
    """The files a task sent back, written under ``run_dir`` (a file already there with the same bytes, as on
    the task's own machine, is left alone)."""
    for name, data in files.items():
        path = Path(run_dir) / name
        if not (path.is_file() and path.read_bytes() == data):
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)


def describe_error(err: BaseException) -> str:
    """One line for a failed attempt: the task's own exception (type and first line of its message), or what
    Ray says happened to its worker or node."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException):
        err = cause
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def run_ray(jobs: list[Job], view, warm_path: str | Path, options: RayOptions, workers: int | None = None,
            verbose: bool = False, imports: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Train ``jobs`` as Ray tasks (Ray initialised: :func:`ray_session`), at most ``workers`` at a time when
    given, progress folded into ``view`` (a :class:`oar.progress.RunTable`). The warm start cached at
    ``warm_path`` is shared through the object store. Returns, per run, the description of each failed attempt:
    a run with more than ``options.retries`` failures never finished."""
    import ray
    from ray.exceptions import RayError

    from oar.lab.warmstart import cached_files

    task = ray.remote(num_cpus=1, num_gpus=options.gpus_per_run, max_retries=0)(_ray_task)
    # progress only: restarted if its worker dies (the reports it held are lost, the runs are not)
    log = ray.remote(num_cpus=0, max_restarts=-1)(_EventLog).remote()
    warm = ray.put(cached_files(warm_path))  # once; each node fetches it once
    errors: dict[str, list[str]] = {job.name: [] for job in jobs}
    attempt: dict[str, int] = {}
    todo, running = deque(jobs), {}
    limit = workers or len(jobs)

    def drain() -> None:
        try:
            events = ray.get(log.take.remote(), timeout=10)
        except RayError:  # the progress actor is restarting: the table waits, the runs go on
            return
        for event in events:
            name = event.pop("run")
            if event.pop("attempt") == attempt.get(name) and view.rows[name].status not in ("done", "failed"):
                view.update(name, **event)

    try:
        while todo or running:
            while todo and len(running) < limit:
                job = todo.popleft()
                attempt[job.name] = len(errors[job.name])
                ref = task.options(name=f"oar:{job.name}").remote(job, attempt[job.name], warm, log, verbose,
                                                                  imports)
                running[ref] = job
                if not attempt[job.name]:
                    view.update(job.name, status="starting", note="submitted to Ray")
            ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            drain()
            for ref in ready:
                job = running.pop(ref)
                try:
                    summary, files = ray.get(ref)
                except RayError as err:
                    errors[job.name].append(describe_error(err))
                    tries = len(errors[job.name])
                    if tries <= options.retries:
                        view.update(job.name, status="starting", step=0, done=0.0, accuracy=None, started=None,
                                    note=f"retry {tries}/{options.retries} after {errors[job.name][-1]}")
                        todo.appendleft(job)
                    else:
                        view.update(job.name, status="failed", note=errors[job.name][-1])
                    continue
                _write_run(job.run_dir, files)
                view.update(job.name, status="done", accuracy=summary["final"]["eval/accuracy"], note="")
    finally:
        for ref in running:  # an interrupted study leaves nothing training on the cluster
            ray.cancel(ref, force=True)
        ray.kill(log)
    return errors
