"""How much reward SmolLM2-135M-Instruct earns from the start on the bundled ``easy-arithmetic`` set, per prompt
form (the README's ``oar train`` demo; issue #30): GRPO learns only from groups whose completions differ in reward.

For each form, the first ``--problems`` rows after the two worked examples are posed through SmolLM2's chat
template, ``--samples`` completions each are sampled (oar's KV-cached sampler on a bf16 copy, ``--temperature``,
≤ ``--max-new-tokens``) and graded with ``oar.grading.math_reward``, the reward ``oar train`` uses. Reported per form:
mean reward, the share of groups with reward variance (the groups GRPO learns from), the share of completions that
end (eos) within the length, and one sample.

    OMP_NUM_THREADS=1 python benchmarks/bench_demo_prompts.py --out docs/results/demo_prompts

Writes ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from oar.files import atomic_write

WORKED = 2  # the recipe's worked_examples


def forms(examples: list[dict]) -> dict[str, tuple[str, object]]:
    """name -> (what it is, function question -> chat messages)."""
    one_line = "Q: What is 2 + 3?\nA: \\boxed{5}\n\nQ: {q}\nA:"
    in_turn = "".join(f"Q: {e['problem']}\nA: {e['solution']}\n\n" for e in examples) + "Q: {q}\nA:"
    turns = [m for e in examples for m in ({"role": "user", "content": e["problem"]},
                                           {"role": "assistant", "content": e["solution"]})]
    return {
        "plain": ("the question alone", lambda q: [{"role": "user", "content": q}]),
        "instruction": ("the question + 'Put the final answer in \\boxed{}.'",
                        lambda q: [{"role": "user", "content": q + " Put the final answer in \\boxed{}."}]),
        "system": ("a system turn asking for the number in \\boxed{}",
                   lambda q: [{"role": "system", "content": "Answer with only the final number inside \\boxed{}."},
                              {"role": "user", "content": q}]),
        "one-line example": ("one answer-only example in the user turn (the recipe before)",
                             lambda q: [{"role": "user", "content": one_line.replace("{q}", q)}]),
        "worked, in the turn": ("the two worked examples as text in the user turn",
                                lambda q: [{"role": "user", "content": in_turn.replace("{q}", q)}]),
        "worked, as turns": ("the two worked examples as chat turns (--worked_examples 2, the recipe)",
                             lambda q: [*turns, {"role": "user", "content": q}]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=48)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import numpy as np
    import torch

    from oar.easy_arithmetic import easy_arithmetic_rows
    from oar.grading import math_reward
    from oar.models import load_model_and_tokenizer
    from oar.sampling import sample_tokens

    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer("smollm2")
    model = model.to(torch.bfloat16).eval()
    tok.padding_side = "left"
    rows = easy_arithmetic_rows()
    examples, problems = rows[:WORKED], rows[WORKED:WORKED + args.problems]
    results = {}
    for name, (what, messages) in forms(examples).items():
        prompts = [tok.apply_chat_template(messages(r["problem"]), tokenize=False, add_generation_prompt=True)
                   for r in problems for _ in range(args.samples)]
        enc = tok(prompts, return_tensors="pt", padding=True)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = sample_tokens(model, enc.input_ids, enc.attention_mask, max_new_tokens=args.max_new_tokens,
                                temperature=args.temperature, eos_token_ids=[tok.eos_token_id],
                                pad_token_id=tok.pad_token_id)
        texts = tok.batch_decode(out, skip_special_tokens=True)
        reward = np.array(math_reward(None, texts, [r["answer"] for r in problems for _ in range(args.samples)]))
        groups = reward.reshape(-1, args.samples)
        results[name] = {"what": what, "reward": float(reward.mean()),
                         "groups_with_variance": float((groups.std(1) > 0).mean()),
                         "ended": float((out == tok.eos_token_id).any(1).float().mean()),
                         "seconds": time.perf_counter() - t0, "sample": texts[0]}
        print(f"{name}: reward {reward.mean():.3f}, groups with variance {results[name]['groups_with_variance']:.2f}",
              flush=True)
    lines = [f"SmolLM2-135M-Instruct on `easy-arithmetic`: {args.problems} problems × {args.samples} samples, "
             f"T = {args.temperature}, ≤ {args.max_new_tokens} tokens, graded by `math_reward`.", "",
             "| prompt form | reward | groups with variance | ended | sample |", "|---|---|---|---|---|"]
    for name, r in results.items():
        sample = r["sample"].replace("\n", " ").replace("|", "\\|")[:70]
        lines.append(f"| {name}: {r['what']} | {100 * r['reward']:.1f} % | {100 * r['groups_with_variance']:.0f} % "
                     f"| {100 * r['ended']:.0f} % | `{sample}` |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        atomic_write(args.out.with_suffix(".json"), json.dumps({"config": vars(args) | {"out": str(args.out)},
                                                                 "forms": results}, indent=1))
        atomic_write(args.out.with_suffix(".md"), text)


if __name__ == "__main__":
    main()
