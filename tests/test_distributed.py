"""oar.distributed: the scoring pass under FSDP2 and ZeRO-3 (2 processes, gloo on CPU) and its helpers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import require
from oar.credit import get_credit
from oar.distributed import (
    dummy_probe,
    full_policy,
    max_over_ranks,
    pad_to_max_over_ranks,
    sharding_of,
)

WORKER = os.path.join(os.path.dirname(__file__), "fsdp_zero_worker.py")


def run_worker(tmp_path, config: dict, timeout: int = 240) -> list[dict]:
    """The worker on 2 processes; a hang fails the test at ``timeout`` seconds (gloo itself times out at 60 s)."""
    out = tmp_path / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "DS_ACCELERATOR": "cpu"}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
             WORKER, json.dumps(config), str(out)],
            env=env, capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{config} hung for {timeout} s")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_plain_module_is_unsharded_and_scored_as_is(tiny_qwen2):
    assert sharding_of(tiny_qwen2) is None
    with full_policy(tiny_qwen2) as policy:
        assert policy is tiny_qwen2


def test_padding_without_process_group_yields_the_items():
    assert max_over_ranks(3) == 3
    assert list(pad_to_max_over_ranks(["a", "b"], "dummy")) == [("a", True), ("b", True)]
    assert list(pad_to_max_over_ranks([], "dummy")) == []


@pytest.mark.parametrize("credit", ["oar-g", "oar-p"])
def test_dummy_probe_makes_scorer_passes(tiny_qwen2, credit):
    """The padding probe is valid and reaches the model: a scorer call on it runs forwards (not an early exit)."""
    calls = []
    hook = tiny_qwen2.register_forward_hook(lambda *_: calls.append(1))
    try:
        scores = get_credit(credit).score(tiny_qwen2, *dummy_probe())
    finally:
        hook.remove()
    assert scores.shape == (1, 4) and torch.isfinite(scores).all()
    assert calls, f"{credit} made no forward pass on the dummy probe"


def test_oar_g_reads_embeddings_only_inside_the_models_forward(tiny_qwen2):
    """A sharded (FSDP2 DTensor) embedding cannot be called on its own; OAR-G only uses it inside forwards."""
    inside, outside = [], []
    flag = tiny_qwen2.register_forward_pre_hook(lambda *_: inside.append(1))
    done = tiny_qwen2.register_forward_hook(lambda *_: inside.pop() and None)
    probe = tiny_qwen2.get_input_embeddings().register_forward_pre_hook(lambda *_: outside.append(not inside))
    try:
        scores = get_credit("oar-g").score(tiny_qwen2, *dummy_probe(token_id=5))  # 0 is the pad: a zero embedding
    finally:
        for h in (flag, done, probe):
            h.remove()
    assert outside and not any(outside), "the embedding layer was called outside the model's forward"
    assert scores[0, 1:3].abs().sum() > 0


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.parametrize(
    "backend,tie,counts",
    [("fsdp2", True, [3, 1]), ("fsdp2", False, [0, 2]), ("zero3", True, [0, 2]), ("zero3", False, [3, 1])],
    ids=["fsdp2-tied-3v1", "fsdp2-untied-0v2", "zero3-tied-0v2", "zero3-untied-3v1"],
)
def test_sharded_scoring_is_exact_and_leaves_training_intact(tmp_path, backend, tie, counts):
    if backend == "zero3":
        require("deepspeed", "ZeRO-3 scoring test")
    ranks = run_worker(tmp_path, {"backend": backend, "tie": tie, "counts": counts})
    assert [r["sharding"] for r in ranks] == [backend, backend]
    assert all(r["local_numel"] < r["full_numel"] for r in ranks), "the weights were not sharded"
    for rank, r in enumerate(ranks):
        # every rank made max(counts) calls per credit: its own batches plus dummy ones
        assert r["scorer_calls"] == {"oar-g": max(counts), "oar-p": max(counts)}
        if counts[rank]:
            assert r["score_error"]["oar-g"] < 1e-5 and r["score_error"]["oar-p"] < 1e-5, r["score_error"]
        assert r["grads_untouched"], f"rank {rank}: scoring changed the accumulated gradients"
        assert r["grad_error"] < 1e-5, f"rank {rank}: the backward after scoring is wrong ({r['grad_error']})"
        assert r["identical"] and r["moved"]


@pytest.mark.ddp
def test_fsdp1_is_refused_with_a_pointer_to_fsdp2(tmp_path):
    ranks = run_worker(tmp_path, {"backend": "fsdp1", "tie": True, "counts": [1, 1]}, timeout=120)
    for r in ranks:
        assert r["sharding"] == "fsdp1"
        assert "fsdp_version: 2" in r["refused"]
