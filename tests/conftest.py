"""Shared fixtures: one torch thread, an offline char tokenizer, tiny randomly initialised LMs."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


def require(module: str, why: str) -> None:
    """Skip when an optional heavy dependency is missing, except in CI (CI=true), where it fails."""
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must install {module!r}: {why}")
        pytest.skip(f"{module!r} is not installed: {why}")


@pytest.fixture(scope="session")
def char_tokenizer():
    from oar.lab.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


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


@pytest.fixture
def tiny_qwen2(char_tokenizer):
    return make_tiny_lm(len(char_tokenizer), "qwen2")


@pytest.fixture
def tiny_llama(char_tokenizer):
    return make_tiny_lm(len(char_tokenizer), "llama")


USER_CREDIT = '''
import torch
from oar.credit import register_credit


@register_credit("user-first", combine="multiply", needs_policy=False, needs_probe=False, passes="0",
                 paper="test", summary="first k tokens doubled", options={"k": 3},
                 effect=lambda scores, mask: 1 + scores)
def first_tokens(batch, k=3):
    n, t = batch.completion_ids.shape
    return (torch.arange(t) < k).float().expand(n, -1)
'''


@pytest.fixture
def user_credit_module(tmp_path, monkeypatch):
    """The name of a module on ``sys.path`` that registers the credit ``user-first`` (``--import`` tests);
    unregistered and forgotten afterwards."""
    import sys

    from oar.credit import unregister_credit

    name = f"user_credit_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(USER_CREDIT)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    unregister_credit("user-first")
    sys.modules.pop(name, None)
