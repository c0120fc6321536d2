"""Two-process data parallel (torchrun, gloo on CPU) with OAR-G weights on: ranks stay in sync."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("trl")


@pytest.mark.ddp
@pytest.mark.slow
def test_two_process_ddp_keeps_parameters_identical(tmp_path):
    out = tmp_path / "ddp.json"
    worker = os.path.join(os.path.dirname(__file__), "ddp_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "ACCELERATE_USE_CPU": "true"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         worker, str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2
    assert result["moved"], "training did not change the parameters"
    assert result["identical"], "parameters diverged across ranks"
    assert len(result["frac_scored"]) == 3
    assert any(f > 0 for f in result["frac_scored"]) and any(s > 0 for s in result["weight_std"])
