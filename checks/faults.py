"""Kill-and-resume trials of ``oar train``: SIGKILL at start-up, during a step, during a checkpoint save and
during the final save, then ``--resume``; compared with the uninterrupted run, for every credit.

Per trial: did the resume finish, were steps lost (last logged step at the kill minus the checkpoint resumed
from), is every ``checkpoint-N`` complete, is ``metrics.jsonl`` exactly steps 1..N (nothing lost or doubled),
and are the final weights bit-identical to the uninterrupted run's. Tiny warm-started model from the test
suite (tests/trainer_setup.py), CPU, one thread per run.

    python checks/faults.py [--credits grpo,oar-g,oar-p,entropy,random] [--out DIR] [--json FILE]
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
    if proc.poll() is not None:
        return "finished"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return kill


def _weights(out: Path):
    from safetensors.torch import load_file

    return load_file(str(out / "model.safetensors"))


def trial(config: Path, root: Path, credit: str, kill: str, reference, rng: random.Random) -> dict:
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
    row["max_abs_diff"] = max((w[k] - reference[k]).abs().max().item() for k in reference)
    row["bit_identical"] = row["max_abs_diff"] == 0.0
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--credits", default=",".join(CREDITS))
    ap.add_argument("--kills", default=",".join(KILLS))
    ap.add_argument("--out", help="work directory (default: a temporary one)")
    ap.add_argument("--json", help="write the trial rows here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="oar-faults-"))
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    config = workspace(root)
    rows = []
    t0 = time.perf_counter()
    for credit in args.credits.split(","):
        ref_dir = root / f"{credit}-reference"
        subprocess.run(_cmd(config, ref_dir, credit, False), env=_env(), check=True, capture_output=True)
        reference = _weights(ref_dir)
        for kill in args.kills.split(","):
            row = trial(config, root, credit, kill, reference, rng)
            rows.append(row)
            print(json.dumps(row), flush=True)
    killed = [r for r in rows if r["happened"] != "finished"]
    print(f"\n{len(rows)} trials in {time.perf_counter() - t0:.0f} s; {len(killed)} killed (the rest finished "
          "before the kill point)")
    print(f"kills survived (resume finished, checkpoints complete, metrics exact): "
          f"{sum(r['resume_rc'] == 0 and r['checkpoints_complete'] and r.get('metrics_exact') for r in killed)}"
          f"/{len(killed)}; steps lost: max {max((r['steps_lost'] for r in killed), default=0)}, "
          f"total {sum(r['steps_lost'] for r in killed)}")
    print("resumes bit-identical (only trials resumed mid-run, from 0 < checkpoint < max_steps):")
    for credit in args.credits.split(","):
        rs = [r for r in rows if r["credit"] == credit and 0 < r["resumed_from"] < MAX_STEPS]
        same = sum(bool(r.get("bit_identical")) for r in rs)
        worst = max((r.get("max_abs_diff", float("nan")) for r in rs), default=float("nan"))
        print(f"  {credit:8s} {same}/{len(rs)} (max |dw| {worst:.3g})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
