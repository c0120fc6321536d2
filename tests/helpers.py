"""What the tests share besides fixtures (``from helpers import ...``; the fixtures live in conftest.py).

``TEST_DATA``: the first rows of every benchmark file, vendored under ``tests/data`` (its README names the
sources), in the layout of ``../shared/data``, so ``oar eval`` and the grader run on real rows in any clone.
``shared_data()``: the full benchmark files, for the test that reads every row; it skips, saying so, without them.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

TEST_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
SHARED_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def shared_data() -> str:
    """The full benchmark files (``../shared/data`` next to the repository); skips the test where it is missing."""
    if not os.path.isdir(SHARED_DATA):
        pytest.skip(f"the full benchmark files are not here ({os.path.normpath(SHARED_DATA)} is missing); "
                    "tests/data holds their first rows")
    return SHARED_DATA


def require(module: str, why: str) -> None:
    """Skip when an optional heavy dependency is missing, except in CI (CI=true), where it fails."""
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must install {module!r}: {why}")
        pytest.skip(f"{module!r} is not installed: {why}")


def make_tiny_lm(vocab_size: int, arch: str = "qwen2", hidden: int = 64, layers: int = 2, seed: int = 0):
    """A randomly initialised causal LM small enough for exactness tests (float32, eval mode)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True,
    )
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(f"unknown arch {arch!r}")
    return model.float().eval()
