"""Shared setup of the SmolLM2 step benchmarks (bench_lm_step.py, bench_lm_profile.py): the CPU's features and a
trainer built as ``oar train`` builds it at one of three shapes.

- ``bench``: 2 prompts x 8 completions of <= 96 tokens, bundled ``easy-arithmetic`` (the question in oar's prompt);
- ``lab``: the LM lab's, 4 prompts x 4 completions of the lab task in SmolLM2's chat template (lr 5e-6,
  ``dr_grpo``), on the base model (the shapes, not the warm start's weights);
- ``demo``: ``recipes/smollm2-easy-arithmetic.yaml`` (4 x 8, <= 32 tokens, two worked examples as chat turns).
"""

from __future__ import annotations

from pathlib import Path

PHASES = ("generate", "reward", "credit", "forward", "backward", "optimizer")
SHAPES = ("bench", "lab", "demo")


def cpu_features() -> dict:
    """The CPU's model name and the matmul-relevant feature flags Linux reports (avx2, avx512*, amx*)."""
    out = {"model": "unknown", "flags": []}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("model name") and out["model"] == "unknown":
            out["model"] = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            flags = line.split(":", 1)[1].split()
            out["flags"] = sorted(f for f in flags if f.startswith(("avx2", "avx512", "amx", "fma")))
            break
    return out


def build_trainer_at(shape: str, credit: str, steps: int, overrides: dict, callbacks=None):
    """The trainer of ``shape`` with ``credit``, ``steps`` steps, this machine's CPU defaults plus ``overrides``."""
    from oar.train_run import TrainArguments, build_trainer, cpu_defaults
    from oar.trainer import OARConfig

    common = dict(output_dir=f"/tmp/oar-profile/{shape}", credit=credit, seed=0, max_steps=steps, beta=0.0,
                  logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, **cpu_defaults())
    common.update(overrides)
    if shape in ("bench", "demo"):
        worked = 2 if shape == "demo" else 0
        size = (4, 8, 32, 1e-5) if shape == "demo" else (2, 8, 96, 1e-5)
        config = OARConfig(per_device_train_batch_size=size[0] * size[1], num_generations=size[1],
                           max_completion_length=size[2], learning_rate=size[3], temperature=1.0, **common)
        script = TrainArguments(model="smollm2", dataset="easy-arithmetic", conversational="true" if worked else "auto",
                                prompt_template="{question}" if worked else TrainArguments.prompt_template,
                                worked_examples=worked)
        return build_trainer(script, config, callbacks=callbacks)
    from datasets import Dataset

    from oar.lab.lm import LM_RECIPE
    from oar.lab.task import BOXED, TaskConfig, lab_reward, make_split, max_completion_chars
    from oar.models import load_model_and_tokenizer
    from oar.trainer import OARGRPOTrainer

    task = TaskConfig()
    train = make_split(task, "train", 256, seed=0)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": p.prompt}], "answer": p.answer} for p in train])
    model, tok = load_model_and_tokenizer("smollm2")
    config = OARConfig(per_device_train_batch_size=LM_RECIPE["prompts_per_step"] * LM_RECIPE["group_size"],
                       num_generations=LM_RECIPE["group_size"], max_completion_length=max_completion_chars(task) + 8,
                       learning_rate=LM_RECIPE["lr"], loss_type="dr_grpo", temperature=1.0, top_k=0, top_p=1.0,
                       lr_scheduler_type="constant", conclude_text=BOXED, **common)
    return OARGRPOTrainer(model=model, args=config, processing_class=tok, reward_funcs=lab_reward, train_dataset=ds,
                          callbacks=callbacks)


def step_tokens(batch: dict) -> dict[str, float]:
    """A rollout batch's token counts: rows, prompt and completion tokens (real ones), decode steps (the longest
    completion's length: the sampler runs that many steps)."""
    return {"rows": float(batch["completion_ids"].shape[0]), "prompt": float(batch["prompt_mask"].sum()),
            "completion": float(batch["completion_mask"].sum()),
            "decode_steps": float(batch["completion_mask"].sum(1).max())}
