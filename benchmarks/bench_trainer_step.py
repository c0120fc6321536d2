"""Step time of OARGRPOTrainer per credit, relative to plain GRPO, and the share of the importance pass.

A ~1M-parameter Qwen2 (char tokenizer) is warm-started on a two-step one-digit addition task with boxed answers, then
trained for a few GRPO steps with each credit on the same data and seed. Reports the mean wall step time
(TRL's ``step_time``, first step dropped), the process CPU time per step (robust to other load on a shared
machine; one torch thread), their ratios to ``credit=grpo`` and the importance pass's share of the step.

    OMP_NUM_THREADS=1 python benchmarks/bench_trainer_step.py [--steps 6] [--completion 64]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time

import torch


def rows(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b, c = (rng.randint(0, 9) for _ in range(3))
        out.append({"prompt": f"{a}+{b}+{c}=", "answer": str(a + b + c),
                    "solution": f"{a}+{b}={a + b}, {a + b}+{c}={a + b + c}. \\boxed{{{a + b + c}}}"})
    return out


def reward(prompts, completions, answer, solution, **kwargs) -> list[float]:
    """Partial credit (so most groups have reward variance, as on real math data): 0.5 for the right
    intermediate sum, 0.5 for the right boxed answer."""
    from oar.answer_span import locate_answer

    out = []
    for text, ref, sol in zip(completions, answer, solution, strict=True):
        span = locate_answer(text)
        final = span is not None and span.answer(text).strip() == ref
        out.append(0.5 * (sol.split(",")[0] in text) + 0.5 * final)
    return out


def warm_model(tok, hidden: int, layers: int, steps: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True,
    ))
    data = rows(2048, seed=1)
    texts = [r["prompt"] + r["solution"] + tok.eos_token for r in data]
    enc = tok(texts, add_special_tokens=False, padding=True, padding_side="right", return_tensors="pt")
    labels = enc.input_ids.masked_fill(enc.attention_mask == 0, -100)
    labels[:, :6] = -100  # the prompt "a+b+c="
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        i = torch.randint(0, len(data), (32,), generator=gen)
        loss = model(input_ids=enc.input_ids[i], attention_mask=enc.attention_mask[i], labels=labels[i]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def run(credit: str, base, tok, steps: int, completion: int, batch: int, oar_batch: int) -> dict[str, float]:
    import copy

    import datasets

    from oar.trainer import OARConfig, OARGRPOTrainer

    with tempfile.TemporaryDirectory() as tmp:
        args = OARConfig(
            output_dir=tmp, use_cpu=True, bf16=False, report_to="none", seed=0, credit=credit,
            per_device_train_batch_size=batch, num_generations=8, max_completion_length=completion,
            max_steps=steps, learning_rate=1e-4, logging_steps=1, save_strategy="no", disable_dropout=True,
            gradient_checkpointing=False, oar_batch_size=oar_batch,
        )
        trainer = OARGRPOTrainer(model=copy.deepcopy(base), reward_funcs=reward, args=args,
                                 train_dataset=datasets.Dataset.from_list(rows(256, seed=2)),
                                 processing_class=tok)
        cpu0 = time.process_time()
        trainer.train()
        cpu = (time.process_time() - cpu0) / steps
    logs = [h for h in trainer.state.log_history if "step_time" in h][1:]
    return {
        "step_time": statistics.mean(h["step_time"] for h in logs),
        "cpu_step_time": cpu,
        "importance_time": statistics.mean(h["oar/importance_time"] for h in logs),
        "importance_share": sum(h["oar/importance_time"] for h in logs) / sum(h["step_time"] for h in logs),
        "reward": statistics.mean(h["reward"] for h in logs),
        "frac_scored": statistics.mean(h["oar/frac_scored"] for h in logs),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--completion", type=int, default=64, help="max_completion_length")
    p.add_argument("--batch", type=int, default=16, help="completions per step (num_generations=8)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--oar-batch-size", type=int, default=8, help="completions per importance-scorer call")
    p.add_argument("--credits", default="grpo,oar-g,oar-p")
    a = p.parse_args()
    torch.set_num_threads(1)

    from oar.lab.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    t0 = time.perf_counter()
    base = warm_model(tok, a.hidden, a.layers, a.sft_steps)
    n_params = sum(p.numel() for p in base.parameters())
    print(f"model: {n_params / 1e6:.2f}M params, warm start {time.perf_counter() - t0:.0f}s")
    results = {c: run(c, base, tok, a.steps, a.completion, a.batch, a.oar_batch_size) for c in a.credits.split(",")}
    ref = results.get("grpo", {}).get("step_time")
    cpu_ref = results.get("grpo", {}).get("cpu_step_time")
    print(f"{'credit':>8} {'step s':>8} {'x grpo':>7} {'cpu s':>7} {'x grpo':>7} {'imp s':>7} {'share':>6} "
          f"{'scored':>6} {'reward':>6}")
    for c, r in results.items():
        ratio = r["step_time"] / ref if ref else float("nan")
        cpu_ratio = r["cpu_step_time"] / cpu_ref if cpu_ref else float("nan")
        print(f"{c:>8} {r['step_time']:8.3f} {ratio:7.2f} {r['cpu_step_time']:7.3f} {cpu_ratio:7.2f} "
              f"{r['importance_time']:7.3f} {r['importance_share']:6.1%} {r['frac_scored']:6.1%} {r['reward']:6.2f}")
    print(json.dumps({"params": n_params, **results}))


if __name__ == "__main__":
    main()
