"""One rank of the OARGRPOTrainer FSDP2 / ZeRO-3 test, launched by ``accelerate launch --config_file CFG`` on CPU.

``python -m accelerate.commands.launch --config_file CFG tests/fsdp_zero_trainer_worker.py CONFIG_JSON OUT``
with CONFIG ``{"credit": "oar-g" | "oar-p", "tie": bool}``. Trains the warm tiny LM for 3 steps; rank 0 writes
the backend seen, the losses and OAR metrics per step, every rank's scorer-call counts (own, max over ranks),
whether the parameters are finite, moved and identical across ranks; the final parameters go to OUT.pt.

accelerate runs FSDP and DeepSpeed only on accelerators: with ``use_cpu`` it silently falls back to plain DDP.
The test-only shim below restores the requested backend on CPU (gloo); nothing in ``oar`` depends on it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile

import torch

from trainer_setup import exact_reward, grpo_kwargs, task_rows, warm_tiny_lm


def keep_fsdp_and_deepspeed_on_cpu() -> None:
    """Test-only: make accelerate keep FSDP / DeepSpeed when it falls back to MULTI_CPU (re-applied on every
    ``AcceleratorState()``, which re-copies ``distributed_type`` from ``PartialState``); skip DeepSpeed's JIT
    build of its CPU all-reduce speed-up (~2 min of g++; plain gloo does the job)."""
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, mixed_precision=None, cpu=False, dynamo_plugin=None, deepspeed_plugin=None, fsdp_plugin=None,
             *args, **kwargs):
        original(self, mixed_precision, cpu, dynamo_plugin, deepspeed_plugin, fsdp_plugin, *args, **kwargs)
        if self.distributed_type != DistributedType.MULTI_CPU:
            return
        if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
            if fsdp_plugin is not None:
                self.fsdp_plugin = fsdp_plugin
            if getattr(self, "fsdp_plugin", None) is not None:
                self.distributed_type = DistributedType.FSDP
        elif os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
            if deepspeed_plugin is not None:
                deepspeed_plugin.set_mixed_precision("no")
                deepspeed_plugin.select(_from_accelerator_state=True)
                self.deepspeed_plugins = deepspeed_plugin
                self._mixed_precision = "no"
            if getattr(self, "deepspeed_plugins", None) is not None:
                self.distributed_type = DistributedType.DEEPSPEED

    AcceleratorState.__init__ = init
    if importlib.util.find_spec("deepspeed") is not None:
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def untie(model: torch.nn.Module) -> torch.nn.Module:
    """The model with its own copy of the output embeddings (as Qwen2.5-7B: untied)."""
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    assert model.lm_head.weight is not model.get_input_embeddings().weight
    return model


def main(config: dict, out_path: str) -> None:
    torch.set_num_threads(1)
    keep_fsdp_and_deepspeed_on_cpu()
    import datasets
    import torch.distributed as dist

    import oar.distributed
    from oar.distributed import sharding_of
    from oar.lab.tokenizer import build_char_tokenizer
    from oar.trainer import OARConfig, OARGRPOTrainer

    calls: list[list[int]] = []  # per rollout batch: this process's scorer calls, the max over processes
    max_over_ranks = oar.distributed.max_over_ranks

    def recording_max(n, group=None):
        calls.append([n, max_over_ranks(n, group)])
        return calls[-1][1]

    oar.distributed.max_over_ranks = recording_max

    tok = build_char_tokenizer()
    model = warm_tiny_lm(tok)
    if not config["tie"]:
        model = untie(model)
    flat0 = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
    with tempfile.TemporaryDirectory() as tmp:
        args = OARConfig(**grpo_kwargs(tmp, max_steps=3, per_device_train_batch_size=4), credit=config["credit"],
                         oar_batch_size=1)
        trainer = OARGRPOTrainer(model=model, reward_funcs=exact_reward, args=args,
                                   train_dataset=datasets.Dataset.from_list(task_rows(48, seed=3)),
                                   processing_class=tok)
        trainer.train()
    wrapped = trainer.model_wrapped
    kind = sharding_of(wrapped)
    params = list(trainer.accelerator.unwrap_model(trainer.model).parameters())
    if kind == "fsdp2":
        flat = torch.cat([p.full_tensor().detach().flatten() for p in params])
    elif kind == "zero3":
        import deepspeed

        with deepspeed.zero.GatheredParameters(params):
            flat = torch.cat([p.detach().flatten().clone() for p in params])
    else:
        flat = torch.cat([p.detach().flatten() for p in params])
    world = dist.get_world_size()
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    every_calls = [None] * world
    dist.all_gather_object(every_calls, calls)
    if dist.get_rank() == 0:
        logs = [h for h in trainer.state.log_history if "loss" in h]
        result = {
            "sharding": kind, "world_size": world,
            "loss": [h["loss"] for h in logs],
            "frac_scored": [h["oar/frac_scored"] for h in logs],
            "weight_std": [h["oar/weight_std"] for h in logs],
            "frac_nonfinite": [h["oar/frac_nonfinite"] for h in logs],
            "calls": every_calls,
            "finite": bool(torch.isfinite(flat).all()),
            "identical": all(torch.equal(gathered[0], g) for g in gathered[1:]),
            "moved": not torch.equal(flat, flat0),
            "moved_by": (flat - flat0).abs().max().item(),
        }
        torch.save(flat, out_path + ".pt")
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(result, f)
    # leave the gloo group, then skip the interpreter's teardown: C++ threads destroyed at exit aborted a rank
    # now and then ('terminate called without an active exception'), after the results were written
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
