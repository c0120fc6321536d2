"""Fixtures only (one torch thread for every test, an offline char tokenizer, tiny randomly initialised LMs, a user
credit module); what tests share besides fixtures is in helpers.py."""

from __future__ import annotations

import os

import pytest
import torch

from helpers import make_tiny_lm

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

@pytest.fixture(scope="session")
def char_tokenizer():
    from oar.lab.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


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
