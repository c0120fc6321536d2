"""The lab's small causal LM (a tiny Qwen2) plus batched sampling and held-out accuracy."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oar.lab.task import LabProblem, extract_int
from oar.lab.tokenizer import build_char_tokenizer


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the lab model: a Qwen2 decoder (about 0.25M params by default); ``tie_embeddings`` shares the
    input embeddings with the output head."""

    hidden: int = 96
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    mlp: int = 384
    max_len: int = 256
    tie_embeddings: bool = False


def lab_tokenizer():
    """The lab's offline char tokenizer (printable ASCII, left padding); every probe text encodes exactly."""
    return build_char_tokenizer()


def build_model(cfg: ModelConfig, vocab_size: int, seed: int = 0):
    """A randomly initialised float32 ``Qwen2ForCausalLM`` of shape ``cfg``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=cfg.hidden, intermediate_size=cfg.mlp, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads, max_position_embeddings=cfg.max_len,
        pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=cfg.tie_embeddings,
    )
    return Qwen2ForCausalLM(config).float()


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], temperature: float = 1.0, max_new_tokens: int = 128,
           batch_size: int = 512, seed: int = 0) -> list[str]:
    """Complete every prompt once (greedy iff ``temperature == 0``); returns the completion texts."""
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        enc = tokenizer(prompts[i : i + batch_size], return_tensors="pt", padding=True)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        out += tokenizer.batch_decode(_decode(model, ids, mask, temperature, max_new_tokens, gen),
                                      skip_special_tokens=True)
    model.train(was_training)
    return out


def _decode(model, ids: torch.Tensor, mask: torch.Tensor, temperature: float, max_new: int,
            gen: torch.Generator) -> torch.Tensor:
    """KV-cached ancestral sampling from left-padded ``ids [B, P]``; returns ``[B, <=max_new]`` ids (eos → pad)."""
    from transformers import DynamicCache

    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    cache = DynamicCache()
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache).logits[:, -1]
    done = torch.zeros(ids.shape[0], dtype=torch.bool)
    next_pos = pos[:, -1:] + 1
    toks = []
    for _ in range(max_new):
        if temperature > 0:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        else:
            tok = logits.argmax(-1)
        tok = tok.masked_fill(done, pad)
        toks.append(tok)
        done |= tok == eos
        if done.all():
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos,
                       past_key_values=cache).logits[:, -1]
        next_pos = next_pos + 1
    out = torch.stack(toks, 1)
    return out.masked_fill(out == eos, pad)


def accuracy(model, tokenizer, problems: list[LabProblem], k: int = 4, temperature: float = 1.0,
             max_new_tokens: int = 128, seed: int = 0) -> dict[str, float]:
    """Held-out accuracy: ``accuracy`` = avg@k at ``temperature`` (mean over k samples per problem),
    ``pass_at_k``, ``greedy_accuracy``, and ``mean_length`` (chars of the sampled completions)."""
    prompts = [p.prompt for p in problems]
    answers = [p.answer for p in problems]
    texts = sample(model, tokenizer, prompts * k, temperature, max_new_tokens, seed=seed)
    hits = torch.tensor([extract_int(t) == a for t, a in zip(texts, answers * k, strict=True)],
                        dtype=torch.float).view(k, -1)
    greedy = sample(model, tokenizer, prompts, 0.0, max_new_tokens)
    g_hits = [extract_int(t) == a for t, a in zip(greedy, answers, strict=True)]
    return {
        "accuracy": hits.mean().item(),
        "pass_at_k": hits.amax(0).mean().item(),
        "greedy_accuracy": sum(g_hits) / max(len(g_hits), 1),
        "mean_length": sum(map(len, texts)) / max(len(texts), 1),
    }
