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
    """Complete every prompt once (greedy iff ``temperature == 0``) with :func:`oar.sampling.sample_tokens`
    (left padding, KV cache); ``prompts`` are final texts (the LM lab's are in the chat template). Returns the
    completion texts."""
    from oar.sampling import sample_tokens

    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        enc = tokenizer(prompts[i : i + batch_size], return_tensors="pt", padding=True, padding_side="left",
                        add_special_tokens=False)
        new = sample_tokens(model, enc["input_ids"], enc["attention_mask"], max_new_tokens=max_new_tokens,
                            temperature=temperature, eos_token_ids=model.config.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id, generator=gen)
        out += tokenizer.batch_decode(new, skip_special_tokens=True)
    model.train(was_training)
    return out


def accuracy(model, tokenizer, problems: list[LabProblem], k: int = 4, temperature: float = 1.0,
             max_new_tokens: int = 128, seed: int = 0, prompts: list[str] | None = None,
             batch_size: int = 512) -> dict[str, float]:
    """Held-out accuracy: ``accuracy`` = avg@k at ``temperature`` (mean over k samples per problem),
    ``pass_at_k``, ``greedy_accuracy``, and ``mean_length`` (chars of the sampled completions). ``prompts``: the
    texts fed to the model (default the problems' own prompts; the LM lab passes them in its chat template)."""
    prompts = [p.prompt for p in problems] if prompts is None else prompts
    answers = [p.answer for p in problems]
    texts = sample(model, tokenizer, prompts * k, temperature, max_new_tokens, batch_size, seed=seed)
    hits = torch.tensor([extract_int(t) == a for t, a in zip(texts, answers * k, strict=True)],
                        dtype=torch.float).view(k, -1)
    greedy = sample(model, tokenizer, prompts, 0.0, max_new_tokens, batch_size)
    g_hits = [extract_int(t) == a for t, a in zip(greedy, answers, strict=True)]
    return {
        "accuracy": hits.mean().item(),
        "pass_at_k": hits.amax(0).mean().item(),
        "greedy_accuracy": sum(g_hits) / max(len(g_hits), 1),
        "mean_length": sum(map(len, texts)) / max(len(texts), 1),
    }
