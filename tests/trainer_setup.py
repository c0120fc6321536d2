"""A trivial boxed-answer addition task and a briefly warm-started tiny LM, for the trainer tests.

The warm start (a few hundred milliseconds of teacher forcing) makes the tiny model write completions like
``"3+4 is 7, \\boxed{7}"`` often but not always correctly, so GRPO groups have non-zero advantages and the
outcome probe finds answers.
"""

from __future__ import annotations

import copy
import functools
import random

import torch

from helpers import make_tiny_lm
from oar.answer_span import locate_answer


def task_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` addition problems ``{"prompt": "3+4=", "answer": "7"}`` with one-digit operands."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return rows


def solution(row: dict[str, str]) -> str:
    return f"{row['prompt'][:-1]} is {row['answer']}, \\boxed{{{row['answer']}}}"


def exact_reward(prompts: list, completions: list, answer: list[str], **kwargs) -> list[float]:
    """1.0 when the completion's located final answer equals the reference string, else 0.0."""
    out = []
    for text, ref in zip(completions, answer, strict=True):
        span = locate_answer(text)
        out.append(float(span is not None and span.answer(text).strip() == str(ref).strip()))
    return out


def first_group_reward(prompts: list, completions: list, **kwargs) -> list[float]:
    """1.0 for the batch's first completion, else 0.0: with groups of 4, the first group has reward variance and
    the others none, whatever the model samples (tests that need both kinds of group use it)."""
    return [float(i == 0) for i in range(len(completions))]


def warm_tiny_lm(tokenizer, steps: int = 150, seed: int = 0, hidden: int = 64):
    """A fresh copy of a tiny Qwen2 taught the answer format by ``steps`` teacher-forced Adam steps (float32).

    Trained once per process and settings (cached), so every test file pays for it at most once.
    """
    return copy.deepcopy(_warm_tiny_lm(tokenizer, steps, seed, hidden))


@functools.cache
def _warm_tiny_lm(tokenizer, steps: int, seed: int, hidden: int):
    model = make_tiny_lm(len(tokenizer), "qwen2", hidden=hidden, seed=seed)
    rows = task_rows(256, seed=seed + 1)
    texts = [r["prompt"] + solution(r) + tokenizer.eos_token for r in rows]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids))
    batch = torch.full((len(ids), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(batch)
    for i, row in enumerate(ids):
        batch[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    labels = batch.masked_fill(mask == 0, -100)
    labels[:, :4] = -100  # the prompt
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        pick = torch.randint(0, len(ids), (32,), generator=gen)
        loss = model(input_ids=batch[pick], attention_mask=mask[pick], labels=labels[pick]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def grpo_kwargs(output_dir: str, **overrides) -> dict:
    """Small CPU GRPO settings shared by the trainer tests (override any field)."""
    kw = dict(
        output_dir=output_dir, use_cpu=True, bf16=False, report_to="none", seed=0,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=24, max_steps=2,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", temperature=1.0,
        disable_dropout=True, dataloader_num_workers=0,
    )
    kw.update(overrides)
    return kw
