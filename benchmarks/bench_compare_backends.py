"""What a run costs beyond its training on each ``oar compare`` backend: the local process pool and a local Ray
cluster, on the same small study (docs/scaling.md, "Overhead per run").

    python benchmarks/bench_compare_backends.py [--seeds 2] [--max-steps 5] [--workers 2] [--out runs/backends]

Both backends train the same runs (the quick preset's warm start, cached once before either is timed; GRPO and
OAR-G × ``--seeds``, stopped at ``--max-steps`` updates). Per backend it measures the study's wall time and the CPU
seconds of this process and every process it started (pool workers; Ray's daemons and workers), and subtracts the
runs' own training and evaluation CPU seconds (each run's training-thread clock, ``summary.json``): what remains,
per run, is the cost of the backend and of a run's set-up (process start, imports, model and trainer
construction, result transfer). CPU seconds do not depend on what else the machine runs; wall seconds do. Starting
the Ray cluster is measured apart (once per study). Writes ``OUT/backends.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import psutil

from oar.files import atomic_write
from oar.lab.compare import PRESETS, base_config, compare
from oar.lab.ray_pool import RayOptions, runtime_env, start_local_ray
from oar.lab.warmstart import warm_start
from oar.quiet import quiet_libraries
from oar.rundir import RunDir


def tree_cpu() -> float:
    """CPU seconds (user + system) of this process and every process it started, finished or running."""
    total = 0.0
    me = psutil.Process()
    for p in (me, *me.children(recursive=True)):
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system  # reaped children are counted by parents
    return total


def measure(name: str, run, out: Path, cpu0: float | None = None) -> dict:
    t0, c0 = time.perf_counter(), tree_cpu() if cpu0 is None else cpu0
    results = run()
    wall, cpu = time.perf_counter() - t0, tree_cpu() - c0
    work = [RunDir(out / f"{r['credit']}-s{r['seed']}").summary() for r in results["runs"]]
    train = sum(s["train_seconds"] + s["eval_seconds"] for s in work)
    n = len(work)
    return {"backend": name, "runs": n, "wall_s": wall, "cpu_s": cpu, "run_cpu_s": train,
            "overhead_cpu_s_per_run": (cpu - train) / n, "steps": [s["steps"] for s in work]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="runs/backends")
    args = ap.parse_args(argv)
    import ray

    out = Path(args.out)
    base = base_config(PRESETS["quick"], overrides={"max_steps": args.max_steps, "budget_s": 10_000.0})
    with quiet_libraries():
        warm_start(base.warm, progress=False)  # cached before either backend is timed
    common = {"seeds": args.seeds, "report": False, "progress": False}
    columns = PRESETS["quick"].credits
    rows = [measure("local pool", lambda: compare(out / "local", base, columns, workers=args.workers, **common),
                    out / "local")]
    t0, c0 = time.perf_counter(), tree_cpu()
    start_local_ray(num_cpus=args.workers, log_to_driver=False, logging_level=logging.ERROR,
                    runtime_env=runtime_env())
    start = {"wall_s": time.perf_counter() - t0, "cpu_s": tree_cpu() - c0}
    try:
        rows.append(measure("Ray, local cluster", lambda: compare(out / "ray", base, columns, ray=RayOptions(),
                                                                  **common), out / "ray"))
    finally:
        ray.shutdown()
    report = {"seeds": args.seeds, "max_steps": args.max_steps, "workers": args.workers,
              "cpu_count": len(psutil.Process().cpu_affinity()), "load_1min": psutil.getloadavg()[0],
              "ray_version": ray.__version__, "ray_start": start, "rows": rows}
    atomic_write(out / "backends.json", json.dumps(report, indent=1))
    print("| backend | runs | wall s | CPU s (all processes) | runs' training + eval CPU s | overhead CPU s / run |\n"
          "|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['runs']} | {r['wall_s']:.0f} | {r['cpu_s']:.1f} | {r['run_cpu_s']:.1f} "
              f"| {r['overhead_cpu_s_per_run']:.1f} |")
    print(f"\nRay cluster start (once per study): {start['wall_s']:.1f} s wall, {start['cpu_s']:.1f} CPU s; "
          f"{report['cpu_count']} core(s) usable, load {report['load_1min']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
