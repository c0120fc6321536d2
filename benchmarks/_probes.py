"""Shared setup of the importance benchmarks: a random Qwen2 model and random right-padded probes."""

from __future__ import annotations

import torch


def build_model(vocab: int, hidden: int, layers: int, device: str, dtype: torch.dtype, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 1), num_key_value_heads=max(hidden // 128, 1),
        max_position_embeddings=4096, pad_token_id=0, eos_token_id=1, tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()


def make_probes(batch: int, prompt: int, reasoning: int, conclude: int, answer: int, vocab: int,
                device: str, ragged: bool = False, seed: int = 0):
    """``[B, L]`` probes laid out like OutcomeProbe's: prompt, reasoning, conclude, answer, "}", padding.

    ``ragged``: row b drops ``b * reasoning // (2 * batch)`` reasoning tokens (different lengths).
    """
    gen = torch.Generator().manual_seed(seed)
    L = prompt + reasoning + conclude + answer + 1
    ids = torch.randint(3, vocab, (batch, L), generator=gen)
    am = torch.zeros(batch, L, dtype=torch.long)
    rm = torch.zeros(batch, L, dtype=torch.bool)
    ans = torch.zeros(batch, L, dtype=torch.bool)
    for b in range(batch):
        r = reasoning - (b * reasoning // (2 * batch) if ragged else 0)
        n = prompt + r + conclude + answer + 1
        am[b, :n] = 1
        ids[b, n:] = 0
        rm[b, prompt : prompt + r] = True
        ans[b, prompt + r + conclude : prompt + r + conclude + answer] = True
    return [t.to(device) for t in (ids, am, rm, ans)]
