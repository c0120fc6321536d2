"""Kill-and-resume trials of ``oar train``, ``oar eval`` and ``oar compare``: SIGKILL at a random moment, then
resume, compared with the uninterrupted run.

``oar train`` (every credit): killed at start-up, during a step, during a checkpoint save and during the final save,
then ``--resume``. Per trial: did the resume finish, were steps lost (last logged step at the kill minus the
checkpoint resumed from), is every ``checkpoint-N`` complete, are ``metrics.jsonl`` exactly steps 1..N and the
attribution dumps exactly the uninterrupted run's steps (nothing lost or doubled), and are the final weights
bit-identical to the uninterrupted run's. Tiny warm-started model from the test suite (tests/trainer_setup.py).

``oar eval`` (sampled, the tiny model, GSM8K from ../shared/data): killed at start-up or after some graded batches,
then run again: were the samples written before the kill kept, is every problem present once, and are the samples
and the summary's numbers those of the uninterrupted run.

``oar compare`` (quick preset, grpo and oar-g, equal-updates runs of a few steps): killed at start-up, during the
first runs or after a run finished, then ``--resume``: are finished runs kept as they were (not retrained), does a
worker write after its parent died, are results written, and are every run's logged numbers (all but times) those
of the uninterrupted comparison.

CPU, one thread per run.

    python checks/faults.py [--commands train,eval,compare] [--credits grpo,oar-g,oar-p,entropy,random]
                                [--kills startup,step,save,final] [--trials-eval N] [--trials-compare N]
                                [--out DIR] [--json FILE] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

CREDITS = ("grpo", "oar-g", "oar-p", "entropy", "random")
KILLS = ("startup", "step", "save", "final")
MAX_STEPS, SAVE_STEPS = 6, 2


def workspace(root: Path) -> Path:
    """The tiny model directory, JSONL task and YAML config of the trials; returns the config path."""
    from oar.lab.tokenizer import build_char_tokenizer
    from trainer_setup import task_rows, warm_tiny_lm

    tok = build_char_tokenizer()
    warm_tiny_lm(tok).save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    data = root / "add.jsonl"
    data.write_text("".join(json.dumps({"question": r["prompt"], "gold": r["answer"]}) + "\n"
                            for r in task_rows(48, seed=11)))
    config = root / "train.yaml"
    config.write_text(
        f"model: {root / 'tiny'}\ndataset: {data}\nprompt_column: question\nanswer_column: gold\n"
        "prompt_template: '{question}'\nper_device_train_batch_size: 8\nnum_generations: 4\n"
        f"max_completion_length: 24\nlearning_rate: 0.001\nlr_scheduler_type: constant\nlogging_steps: 1\n"
        f"save_steps: {SAVE_STEPS}\nmax_steps: {MAX_STEPS}\nreport_to: none\nseed: 0\ndisable_tqdm: true\n"
        "oar_dump_every: 2\noar_dump_count: 2\n"
    )
    return config


def _cmd(config: Path, out: Path, credit: str, resume: bool) -> list[str]:
    cmd = [sys.executable, "-c", "import sys; from oar.cli import main; sys.exit(main())", "train",
           "--config", str(config), "--output_dir", str(out), "--credit", credit]
    return cmd + ["--resume"] if resume else cmd


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def _steps(out: Path) -> list[int]:
    from oar.files import read_jsonl

    path = out / "metrics.jsonl"
    return [r["step"] for r in read_jsonl(path)] if path.is_file() else []


def _kill_when(proc: subprocess.Popen, out: Path, kill: str, rng: random.Random, timeout: float = 900) -> str:
    """SIGKILL ``proc`` at the chosen moment; returns what was happening (or 'finished' when it ended first)."""
    from oar.checkpoints import last_checkpoint

    t0 = time.monotonic()
    # mid-step and mid-checkpoint kills come after the first checkpoint, so the resume starts mid-run (a
    # resume from step 0 would be a fresh start and prove nothing about exactness)
    target_step = rng.randint(SAVE_STEPS + 1, MAX_STEPS - 1)
    startup_s = rng.uniform(2, 6)
    while proc.poll() is None and time.monotonic() - t0 < timeout:
        if kill == "startup" and time.monotonic() - t0 > startup_s:
            break
        if kill == "step" and len(_steps(out)) >= target_step:
            time.sleep(rng.uniform(0.0, 0.5))
            break
        if kill == "save" and (out / ".checkpoint-staging").exists() and last_checkpoint(out):
            break
        if kill == "final" and (out / ".model-staging").exists():
            break
        time.sleep(0.01)
    return _sigkill(proc, kill)


def _sigkill(proc: subprocess.Popen, kill: str) -> str:
    """SIGKILL ``proc`` if it still runs and wait for it; ``kill`` (the moment chosen) or 'finished' when it had
    ended first."""
    if proc.poll() is not None:
        return "finished"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return kill


def _weights(out: Path):
    from safetensors.torch import load_file

    return load_file(str(out / "model.safetensors"))


def _dump_steps(out: Path) -> list[int]:
    from oar.files import read_jsonl

    path = out / "attributions.jsonl"
    return [r["step"] for r in read_jsonl(path)] if path.is_file() else []


def trial(config: Path, root: Path, credit: str, kill: str, reference, rng: random.Random,
          reference_dumps: list[int] | None = None) -> dict:
    out = root / f"{credit}-{kill}"
    proc = subprocess.Popen(_cmd(config, out, credit, False), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    happened = _kill_when(proc, out, kill, rng)
    logged_at_kill = max(_steps(out), default=0)
    from oar.checkpoints import checkpoint_step, last_checkpoint

    ckpt = last_checkpoint(out)
    resumed_from = checkpoint_step(ckpt) if ckpt else 0
    complete = all((p / "trainer_state.json").is_file() for p in out.glob("checkpoint-*"))
    done = subprocess.run(_cmd(config, out, credit, True), env=_env(), capture_output=True, text=True)
    row = {"credit": credit, "kill": kill, "happened": happened, "logged_at_kill": logged_at_kill,
           "resumed_from": resumed_from, "steps_lost": max(0, logged_at_kill - resumed_from),
           "checkpoints_complete": complete, "resume_rc": done.returncode}
    if done.returncode != 0:
        row["error"] = done.stderr.strip().splitlines()[-1:] or [""]
        return row
    w = _weights(out)
    row["metrics_exact"] = _steps(out) == list(range(1, MAX_STEPS + 1))
    if reference_dumps is not None:
        row["dumps_exact"] = _dump_steps(out) == reference_dumps
    row["max_abs_diff"] = max((w[k] - reference[k]).abs().max().item() for k in reference)
    row["bit_identical"] = row["max_abs_diff"] == 0.0
    return row


# --- oar eval -------------------------------------------------------------------------------------------------

EVAL_LIMIT, EVAL_SAMPLES, EVAL_BATCH = 24, 4, 4


def _eval_cmd(root: Path, out: Path) -> list[str]:
    return [sys.executable, "-c", "import sys; from oar.cli import main; sys.exit(main())", "eval",
            "--model", str(root / "tiny"), "--benchmarks", "gsm8k", "--data-dir", str(ROOT.parent / "shared" / "data"),
            "--limit", str(EVAL_LIMIT), "--samples", str(EVAL_SAMPLES), "--temperature", "1.0",
            "--max-new-tokens", "24", "--batch-size", str(EVAL_BATCH), "--output-dir", str(out)]


def _sample_lines(out: Path) -> list[dict]:
    path = out / "samples.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line torn by the kill
            pass
    return rows


def _eval_numbers(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    return {b: v["metrics"] for b, v in summary["benchmarks"].items()}


def eval_trial(root: Path, n: int, kill: str, reference: Path, rng: random.Random) -> dict:
    """One ``oar eval`` killed at start-up (2-6 s) or after 1..5 graded batches, then run again."""
    out = root / f"eval-{n}-{kill}"
    proc = subprocess.Popen(_eval_cmd(root, out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0, startup_s, batches = time.monotonic(), rng.uniform(2, 6), rng.randint(1, 5)
    while proc.poll() is None and time.monotonic() - t0 < 900:
        if kill == "startup" and time.monotonic() - t0 > startup_s:
            break
        if kill == "batch" and len(_sample_lines(out)) >= batches * EVAL_BATCH * EVAL_SAMPLES:
            time.sleep(rng.uniform(0.0, 1.0))
            break
        time.sleep(0.01)
    happened = _sigkill(proc, kill)
    at_kill = _sample_lines(out)
    done = subprocess.run(_eval_cmd(root, out), env=_env(), capture_output=True, text=True)
    row = {"command": "eval", "kill": kill, "happened": happened, "samples_at_kill": len(at_kill),
           "resume_rc": done.returncode}
    if done.returncode != 0:
        row["error"] = done.stderr.strip().splitlines()[-1:] or [""]
        return row
    final, ref = _sample_lines(out), _sample_lines(reference)
    key = lambda r: (r["benchmark"], r["index"], r["sample"])  # noqa: E731
    row["kept"] = all(r in final for r in at_kill)  # nothing written before the kill lost or rewritten
    row["each_once"] = len(final) == len({key(r) for r in final}) == EVAL_LIMIT * EVAL_SAMPLES
    row["samples_identical"] = sorted(final, key=key) == sorted(ref, key=key)
    row["summary_identical"] = _eval_numbers(out) == _eval_numbers(reference)
    return row


# --- oar compare ----------------------------------------------------------------------------------------------

COMPARE_STEPS = 4


def _compare_cmd(out: Path, resume: bool) -> list[str]:
    cmd = [sys.executable, "-c", "import sys; from oar.cli import main; sys.exit(main())", "compare", "--quick",
           "--credits", "grpo,oar-g", "--seeds", "1", "--max-steps", str(COMPARE_STEPS), "--budget", "100000",
           "--workers", "2", "--out", str(out)]
    return cmd + ["--resume"] if resume else cmd


def _run_numbers(run_dir: Path) -> list[dict]:
    """A run's logged records without the fields that measure time."""
    from oar.files import read_jsonl

    return [{k: v for k, v in r.items() if "time" not in k and "share" not in k}
            for r in read_jsonl(run_dir / "metrics.jsonl")]


def _run_dirs(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir() and (p / "metrics.jsonl").is_file()) if out.is_dir() else []


def _snapshot(out: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(out.rglob("*")) if p.is_file()}


def compare_trial(root: Path, n: int, kill: str, reference: Path, rng: random.Random) -> dict:
    """One ``oar compare`` killed at start-up (1-4 s), during the runs (after the first training step) or after
    the first run finished, then ``--resume``."""
    out = root / f"compare-{n}-{kill}"
    proc = subprocess.Popen(_compare_cmd(out, False), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    t0, startup_s = time.monotonic(), rng.uniform(1, 4)
    while proc.poll() is None and time.monotonic() - t0 < 900:
        if kill == "startup" and time.monotonic() - t0 > startup_s:
            break
        dirs = _run_dirs(out)
        if kill == "run" and any(len(_run_numbers(d)) >= 2 for d in dirs):  # a step after the first evaluation
            time.sleep(rng.uniform(0.0, 1.0))
            break
        if kill == "after-run" and any((d / "summary.json").is_file() for d in dirs):
            break
        time.sleep(0.02)
    happened = _sigkill(proc, kill)
    time.sleep(1.5)  # the workers notice their parent is gone within 0.5 s
    finished = {d.name: (d / "metrics.jsonl").read_bytes() for d in _run_dirs(out) if (d / "summary.json").is_file()}
    before = _snapshot(out) if out.is_dir() else {}
    time.sleep(3.0)
    orphan_writes = (_snapshot(out) if out.is_dir() else {}) != before
    done = subprocess.run(_compare_cmd(out, True), env=_env(), capture_output=True, text=True)
    row = {"command": "compare", "kill": kill, "happened": happened, "runs_finished_at_kill": len(finished),
           "orphan_writes": orphan_writes, "resume_rc": done.returncode}
    if done.returncode != 0:
        row["error"] = done.stderr.strip().splitlines()[-1:] or [""]
        return row
    row["finished_kept"] = all((out / name / "metrics.jsonl").read_bytes() == data for name, data in finished.items())
    row["results_written"] = (out / "results.json").is_file() and (out / "results.md").is_file()
    ref = {d.name: _run_numbers(d) for d in _run_dirs(reference)}
    row["runs_identical"] = {d.name: _run_numbers(d) for d in _run_dirs(out)} == ref
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commands", default="train,eval,compare")
    ap.add_argument("--credits", default=",".join(CREDITS))
    ap.add_argument("--kills", default=",".join(KILLS), help="oar train's kill points")
    ap.add_argument("--trials-eval", type=int, default=6, help="oar eval trials (half at start-up, half mid-run)")
    ap.add_argument("--trials-compare", type=int, default=6, help="oar compare trials (start-up, run, finished)")
    ap.add_argument("--out", help="work directory (default: a temporary one)")
    ap.add_argument("--json", help="write the trial rows here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="oar-faults-"))
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    config = workspace(root)
    commands = args.commands.split(",")
    rows = []
    t0 = time.perf_counter()
    if "train" in commands:
        for credit in args.credits.split(","):
            ref_dir = root / f"{credit}-reference"
            subprocess.run(_cmd(config, ref_dir, credit, False), env=_env(), check=True, capture_output=True)
            reference, dumps = _weights(ref_dir), _dump_steps(ref_dir)
            for kill in args.kills.split(","):
                row = {"command": "train", **trial(config, root, credit, kill, reference, rng, dumps)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if "eval" in commands:
        subprocess.run(_eval_cmd(root, root / "eval-reference"), env=_env(), check=True, capture_output=True)
        for n in range(args.trials_eval):
            row = eval_trial(root, n, ("startup", "batch")[n % 2], root / "eval-reference", rng)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if "compare" in commands:
        subprocess.run(_compare_cmd(root / "compare-reference", False), env=_env(), check=True, capture_output=True)
        for n in range(args.trials_compare):
            row = compare_trial(root, n, ("startup", "run", "after-run")[n % 3], root / "compare-reference", rng)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{len(rows)} trials in {time.perf_counter() - t0:.0f} s")
    report(rows, args.credits.split(","))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def report(rows: list[dict], credits: list[str]) -> None:
    """The figures of docs/robustness.md from the trial rows."""
    train = [r for r in rows if r["command"] == "train" and r["happened"] != "finished"]
    if train:
        ok = sum(r["resume_rc"] == 0 and r["checkpoints_complete"] and r.get("metrics_exact")
                 and r.get("dumps_exact", True) for r in train)
        print(f"oar train: {len(train)} killed; survived (resume finished, checkpoints complete, metrics and dumps "
              f"exact) {ok}/{len(train)}; steps lost: max {max(r['steps_lost'] for r in train)}, "
              f"total {sum(r['steps_lost'] for r in train)}")
        print("  resumes bit-identical (only trials resumed mid-run, from 0 < checkpoint < max_steps):")
        for credit in credits:
            rs = [r for r in train if r["credit"] == credit and 0 < r["resumed_from"] < MAX_STEPS]
            same = sum(bool(r.get("bit_identical")) for r in rs)
            worst = max((r.get("max_abs_diff", float("nan")) for r in rs), default=float("nan"))
            print(f"    {credit:8s} {same}/{len(rs)} (max |dw| {worst:.3g})")
        others = [r for r in train if not 0 < r["resumed_from"] < MAX_STEPS]
        same = sum(bool(r.get("bit_identical")) for r in others)
        print(f"  other resumes (from 0 or max_steps) bit-identical: {same}/{len(others)}")
    for command, checks in (("eval", ("kept", "each_once", "samples_identical", "summary_identical")),
                            ("compare", ("finished_kept", "results_written", "runs_identical"))):
        rs = [r for r in rows if r["command"] == command and r["happened"] != "finished"]
        if rs:
            counts = ", ".join(f"{c} {sum(bool(r.get(c)) for r in rs)}/{len(rs)}" for c in checks)
            extra = (f", orphan writes {sum(r['orphan_writes'] for r in rs)}/{len(rs)}" if command == "compare" else "")
            print(f"oar {command}: {len(rs)} killed; resumed {sum(r['resume_rc'] == 0 for r in rs)}/{len(rs)}; "
                  f"{counts}{extra}")


if __name__ == "__main__":
    main()
