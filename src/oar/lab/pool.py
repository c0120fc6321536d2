"""Where ``oar compare`` trains its runs: one :class:`Job` per (credit, seed), run by :func:`run_job` in a worker.

The local backend is here: a pool of spawned single-thread processes on this machine (:func:`worker_pool`,
:func:`run_local`), which exit with their parent and send progress reports through a queue. The Ray backend
(:mod:`oar.lab.ray_pool`) runs the same :func:`run_job` as Ray tasks.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.queues
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from oar.credit import import_modules
from oar.lab.run import RunConfig, train_lab
from oar.quiet import quiet_libraries


@dataclass(frozen=True)
class Job:
    """One run to train: its configuration, its run directory and the warm-start cache it loads from."""

    cfg: RunConfig
    run_dir: str
    cache_dir: str | None = None

    @property
    def name(self) -> str:
        """The run's row in the live table and its directory's name (``COLUMN-sSEED``)."""
        return Path(self.run_dir).name


def run_job(job: Job, report: Callable[..., None], verbose: bool = False) -> dict:
    """Train ``job`` in this process (one torch thread, library noise quiet unless ``verbose``); returns its
    summary. ``report(**fields)``: progress, first ``status="running"``, then :func:`oar.lab.run.train_lab`'s."""
    import torch

    torch.set_num_threads(1)
    report(status="running", note="")
    with quiet_libraries(verbose):
        return train_lab(job.cfg, job.run_dir, job.cache_dir, report=report)


def _die_with_parent(parent: int, poll_s: float = 0.5) -> None:
    """Pool-worker initializer: a daemon thread ends this process as soon as ``parent`` is gone (a killed
    ``oar compare`` must not leave a worker training into a run directory a resumed compare will use)."""

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


def _job(job: Job) -> dict:
    """One job in a pool worker, its status and progress sent to the queue set by :func:`_init_worker`."""

    def report(**fields) -> None:
        if _EVENTS is not None:
            _EVENTS.put({"run": job.name, **fields})

    try:
        summary = run_job(job, report, _VERBOSE)
    except BaseException:
        report(status="failed")
        raise
    report(status="done", accuracy=summary["final"]["eval/accuracy"])
    return summary


def _drain(events, view) -> None:
    """Fold progress reports into ``view`` until the ``None`` sentinel."""
    while (event := events.get()) is not None:
        view.update(**event)


def run_local(jobs: list[Job], workers: int, view, verbose: bool = False, imports: tuple[str, ...] = ()) -> None:
    """Train ``jobs`` on ``workers`` spawned processes (in this process when ``workers`` is 1), their progress
    folded into ``view`` (a :class:`oar.progress.RunTable`). The first failure ends the study (raised here); a
    resumed compare keeps the runs that finished."""
    events = mp.get_context("spawn").Queue() if workers > 1 else queue.SimpleQueue()
    drain = threading.Thread(target=_drain, args=(events, view), daemon=True)
    drain.start()
    for job in jobs[:workers]:  # a worker takes a while to import torch and TRL
        view.update(job.name, status="starting", note="loading torch and TRL")
    try:
        if workers == 1:
            _init_worker(events, verbose)
            try:
                for job in jobs:
                    _job(job)
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
