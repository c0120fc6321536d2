"""One rank of the 2-process DDP test: ``torchrun --nproc_per_node 2 tests/ddp_worker.py OUT_JSON [CREDIT]``.

Trains the warm tiny LM with CREDIT (default OAR-G; ``vine`` with k=2, max_steps=2) for 3 steps on CPU (gloo),
then rank 0 writes whether the parameters are identical on every rank, whether they moved, the OAR metrics of
each step, and how many completions each rank graded itself (``vine``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch

from trainer_setup import exact_reward, grpo_kwargs, task_rows, warm_tiny_lm

OPTIONS = {"vine": 'vine@k=2&max_steps=2&separator=" |, "'}  # the credit with its options (a JSON string keeps spaces)


def main(out_path: str, credit: str = "oar-g") -> None:
    torch.set_num_threads(1)
    import datasets
    import torch.distributed as dist

    from oar.lab.tokenizer import build_char_tokenizer
    from oar.trainer import OARConfig, OARGRPOTrainer

    tok = build_char_tokenizer()
    model = warm_tiny_lm(tok)
    flat0 = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
    with tempfile.TemporaryDirectory() as tmp:
        args = OARConfig(**grpo_kwargs(tmp, max_steps=3, per_device_train_batch_size=4),
                         credit=OPTIONS.get(credit, credit))
        trainer = OARGRPOTrainer(model=model, reward_funcs=exact_reward, args=args,
                                 train_dataset=datasets.Dataset.from_list(task_rows(48, seed=3)),
                                 processing_class=tok)
        graded_here = [0.0]  # what this rank graded itself (the logged metric is summed over ranks)
        log_rollout_cost = trainer._log_rollout_cost

        def count_graded(cost: dict[str, int]) -> None:
            graded_here[0] += cost["graded"]
            log_rollout_cost(cost)

        trainer._log_rollout_cost = count_graded
        trainer.train()
    flat = torch.cat([p.detach().flatten() for p in trainer.accelerator.unwrap_model(trainer.model).parameters()])
    world = dist.get_world_size()
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    graded = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(graded, torch.tensor(graded_here, dtype=torch.float64))
    if dist.get_rank() == 0:
        logs = [h for h in trainer.state.log_history if "loss" in h]
        result = {
            "world_size": world,
            "identical": all(torch.equal(gathered[0], g) for g in gathered[1:]),
            "moved": not torch.equal(flat0, flat),
            "frac_scored": [h["oar/frac_scored"] for h in logs],
            "weight_std": [h["oar/weight_std"] for h in logs],
            "offset_abs": [h["oar/offset_abs_mean"] for h in logs],
            "rollout_graded": [h.get("oar/rollout_graded", 0.0) for h in logs],
            "graded_per_rank": [g.item() for g in graded],
        }
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(result, f)
    # leave the gloo group, then skip the interpreter's teardown: C++ threads destroyed at exit aborted a rank
    # now and then ('terminate called without an active exception'), after the results were written
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
