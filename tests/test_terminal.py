"""The live view of ``oar compare`` in a real pseudo-terminal: it draws the warm start and one line per run,
keeps library noise out, prints the compact summary and leaves the terminal as it found it."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

SCRIPT = """
import sys
from oar.lab.compare import PRESETS, base_config, compare
from oar.lab.model import ModelConfig
from oar.lab.summary import print_summary
from oar.lab.task import TaskConfig
from oar.lab.warmstart import WarmStartConfig

if __name__ == "__main__":  # the workers are spawned: they import this file as a module
    out, cache = sys.argv[1], sys.argv[2]
    warm = WarmStartConfig(task=TaskConfig(verbosity=1, slip_rate=0.1), model=ModelConfig(hidden=32, layers=1, mlp=64),
                           steps=30, batch_size=16, lr=1e-2, warmup=5)
    overrides = {"eval_problems": 16, "eval_k": 1, "eval_every": 2, "prompts_per_step": 2, "group_size": 4,
                 "max_completion_length": 48, "budget_s": 3, "warm": warm}
    base = base_config(PRESETS["quick"], overrides=overrides)
    res = compare(out, base, PRESETS["quick"].credits, seeds=1, workers=2, cache_dir=cache)
    print_summary(res, out)
"""
NOISE = ("FutureWarning", "Loading weights", "Writing model shards", "Setting accelerator to CPU", "Traceback")


def run_in_pty(argv: list[str], columns: int = 100, rows: int = 30, timeout: float = 600.0) -> tuple[int, str]:
    """Run ``argv`` with stdin/stdout/stderr on a pseudo-terminal of the given size; (exit code, all output)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "FORCE_COLOR", "NO_COLOR", "TTY_INTERACTIVE",
                                                            "TTY_COMPATIBLE", "COLUMNS", "LINES")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, b"".join(chunks).decode("utf-8", errors="replace")


@pytest.mark.slow
def test_compare_live_view_renders_and_ends_cleanly(tmp_path):
    code, raw = run_in_pty([sys.executable, "-c", SCRIPT, str(tmp_path / "out"), str(tmp_path / "cache")])
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw)  # the screen's text without colours and cursor moves
    assert code == 0, text[-3000:]
    # the live table: the warm start's own line, one line per run, the overall count
    assert "warm start (SFT)" in text and "30/30" in text
    assert re.search(r"grpo-s0 +done", text) and re.search(r"oar-g-s0 +done", text)
    assert "2/2 runs done" in text and "ETA" in text
    # it redrew in place (cursor moves), hid the cursor while live and showed it again at the end
    assert "\x1b[?25l" in raw and raw.rfind("\x1b[?25h") > raw.rfind("\x1b[?25l")
    # the compact summary and the written files
    assert "same budget" in text and "same updates" in text and "s/step" in text
    assert re.search(r"oar-g +\d+\.\d", text)
    for name in ("results.md", "results.json", "report.md"):
        assert str(tmp_path / "out" / name) in text and (tmp_path / "out" / name).is_file()
    # library noise stays out of the view; no line but the file paths (kept whole) is wider than the terminal
    assert not [n for n in NOISE if n in text], text[-3000:]
    lines = [line for line in text.replace("\r", "\n").splitlines() if str(tmp_path) not in line]
    assert max(map(len, lines)) <= 100
