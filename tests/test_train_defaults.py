"""oar train's CPU defaults (docs/results/lm_step.md): no gradient checkpointing, bf16 autocast over fp32 weights
where the CPU has fast bf16, rollouts from a bf16 copy in one process; every one can still be set."""

from __future__ import annotations

import pytest
import torch

from oar.cpu import fast_bf16
from oar.train_run import cpu_defaults, parse_train_args

FAST_BF16 = fast_bf16()
ARGS = ["--model", "smollm2", "--dataset", "easy-arithmetic"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU defaults apply on a machine without CUDA")
def test_cpu_defaults_and_overrides(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    _, config = parse_train_args([*ARGS, "--output_dir", str(tmp_path)])
    assert config.use_cpu and not config.gradient_checkpointing
    assert config.bf16 == FAST_BF16
    assert config.oar_rollout_dtype == ("bfloat16" if FAST_BF16 else None)
    assert config.oar_fast_sampler and config.oar_share_prompt and config.oar_loss_batch_size == 8
    _, config = parse_train_args([*ARGS, "--output_dir", str(tmp_path), "--gradient_checkpointing", "true",
                                  "--bf16", "false", "--oar_rollout_dtype", "float32", "--oar_fast_sampler", "false",
                                  "--oar_share_prompt", "false", "--oar_loss_batch_size", "32"])
    assert config.gradient_checkpointing and not config.bf16 and config.oar_rollout_dtype == "float32"
    assert not config.oar_fast_sampler and not config.oar_share_prompt and config.oar_loss_batch_size == 32


@pytest.mark.parametrize("fast", [True, False])
def test_bf16_and_the_rollout_copy_follow_the_cpu_and_the_process_count(monkeypatch, fast):
    monkeypatch.setattr("oar.cpu.fast_bf16", lambda: fast)  # either kind of CPU, wherever the test runs
    monkeypatch.setenv("WORLD_SIZE", "2")  # the one-process paths are off
    several = cpu_defaults()
    assert several["bf16"] is fast and several["oar_rollout_dtype"] is None
    assert not several["oar_fast_sampler"] and not several["oar_share_prompt"]
    assert several["oar_loss_batch_size"] is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    one = cpu_defaults()
    assert one["oar_rollout_dtype"] == ("bfloat16" if fast else None)
    assert one["oar_fast_sampler"] and one["oar_share_prompt"] and one["oar_loss_batch_size"] == 8


def test_the_bundled_dataset_reads_like_a_file():
    from oar.easy_arithmetic import EASY_ARITHMETIC_ROWS, easy_arithmetic_rows
    from oar.train_data import read_train_dataset

    ds = read_train_dataset("easy-arithmetic")
    assert len(ds) == EASY_ARITHMETIC_ROWS and ds[0] == easy_arithmetic_rows()[0]
    rows = easy_arithmetic_rows(60, seed=3)
    assert rows == easy_arithmetic_rows(60, seed=3) != easy_arithmetic_rows(60, seed=4)
    for r in rows:  # every answer is the value of its question
        nums = [int(t) for t in r["problem"].replace("?", " ").replace(".", " ").split() if t.isdigit()]
        ops = r["problem"]
        if ops.startswith("What is"):
            want = nums[0] + nums[1] if "+" in ops else nums[0] - nums[1]
        else:
            want = nums[0] + nums[1] if "more" in ops else nums[0] - nums[1]
        assert r["answer"] == str(want) and want >= 0 and all(1 <= x <= 9 for x in nums)
