"""Two-process data parallel (torchrun, gloo on CPU) with OAR-G weights, or vine's MC step values, on: ranks stay in
sync."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("trl")


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.parametrize("credit", ["oar-g", "vine"])
def test_two_process_ddp_keeps_parameters_identical(tmp_path, credit):
    out = tmp_path / "ddp.json"
    worker = os.path.join(os.path.dirname(__file__), "ddp_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "ACCELERATE_USE_CPU": "true"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         worker, str(out), credit],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2
    assert result["moved"], "training did not change the parameters"
    assert result["identical"], "parameters diverged across ranks"
    assert len(result["frac_scored"]) == 3
    assert any(f > 0 for f in result["frac_scored"])
    if credit == "vine":  # replace: the token advantages are the offsets; every rank generated and graded
        assert any(o > 0 for o in result["offset_abs"]) and any(g > 0 for g in result["rollout_graded"])
        assert len(result["graded_per_rank"]) == 2 and all(g > 0 for g in result["graded_per_rank"])
    else:
        assert any(s > 0 for s in result["weight_std"])
