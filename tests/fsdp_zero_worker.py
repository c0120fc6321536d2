"""One rank of the sharded-scoring test: ``torchrun --nproc_per_node 2 tests/fsdp_zero_worker.py CONFIG_JSON OUT``.

CONFIG: ``{"backend": "fsdp1" | "fsdp2" | "zero3", "tie": bool, "counts": [n_rank0, n_rank1]}``. A tiny Qwen2 (same seed
on every rank) is sharded; each rank runs one training micro-step, then scores ``counts[rank]`` probe batches
with OAR-G and OAR-P inside ``full_policy`` (calls padded over ranks), then a second micro-step and an optimizer
step. Rank 0 writes JSON: the max score error against an unsharded copy, whether scoring left the gradients
untouched, the full gradient error against the unsharded copy after the second micro-step, and whether the
parameters are identical across ranks after the step. With ``fsdp1`` it only records ``full_policy``'s refusal.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

VOCAB, SEQ = 40, 12


def tiny_lm(tie: bool) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=tie)
    return Qwen2ForCausalLM(cfg).float()


def probe(seed: int) -> tuple[torch.Tensor, ...]:
    """A batch of 2 probes: row 0 with 6 reasoning + 2 answer tokens, row 1 right-padded, 4 + 1."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (2, SEQ), generator=g)
    am = torch.ones(2, SEQ, dtype=torch.long)
    am[1, 9:] = 0
    ids[1, 9:] = 0
    rm = torch.zeros(2, SEQ, dtype=torch.bool)
    ans = torch.zeros(2, SEQ, dtype=torch.bool)
    rm[0, 2:8], ans[0, 9:11] = True, True
    rm[1, 2:6], ans[1, 7] = True, True
    return ids, am, rm, ans


def train_batch(seed: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(seed))


def score_kwargs(credit: str, seed: int) -> dict:
    if credit == "oar-g":
        return {"noise_std": 1e-2, "generator": torch.Generator().manual_seed(seed)}
    return {"chunk_size": 3}


def main(config: dict, out_path: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    from oar.credit import get_credit
    from oar.distributed import dummy_probe, full_policy, pad_to_max_over_ranks, sharding_of

    model = tiny_lm(config["tie"])
    reference = copy.deepcopy(model)  # unsharded, same weights
    backend = config["backend"]
    if backend == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrapped = FullyShardedDataParallel(model, device_id=torch.device("cpu"))
        result = {"sharding": sharding_of(wrapped), "refused": ""}
        try:
            with full_policy(wrapped):
                pass
        except ValueError as e:
            result["refused"] = str(e)
        write(result, out_path)
        return
    if backend == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        wrapped = model
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

        def backward(loss: torch.Tensor) -> None:
            loss.backward()

        def full_grads() -> list[torch.Tensor]:
            return [p.grad.full_tensor().clone() for p in model.parameters()]

        def full_params() -> torch.Tensor:
            return torch.cat([p.full_tensor().flatten() for p in model.parameters()])

        def step() -> None:
            optimizer.step()
            optimizer.zero_grad()
        grad_scale = 1.0
    else:
        import importlib

        import deepspeed
        from deepspeed.utils import safe_get_full_grad

        # test-only: skip the ~2 min g++ build of DeepSpeed's CPU all-reduce speed-up (plain gloo does the job);
        # imported by name because the attribute deepspeed.comm.torch is torch itself
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
        ds_config = {
            "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
            "optimizer": {"type": "SGD", "params": {"lr": 0.5}}, "zero_allow_untested_optimizer": True,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        }
        wrapped, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)

        def backward(loss: torch.Tensor) -> None:
            wrapped.backward(loss)
            if not wrapped.is_gradient_accumulation_boundary():
                wrapped.step()  # counts the micro-step; the update comes at the boundary

        def full_grads() -> list[torch.Tensor]:
            return [safe_get_full_grad(p).clone() for p in wrapped.module.parameters()]

        def full_params() -> torch.Tensor:
            params = list(wrapped.module.parameters())
            with deepspeed.zero.GatheredParameters(params):
                return torch.cat([p.detach().flatten().clone() for p in params])

        def step() -> None:
            wrapped.step()
        grad_scale = 0.5  # the engine divides each micro-step's loss by gradient_accumulation_steps
    result: dict = {"sharding": sharding_of(wrapped), "world_size": world}
    if backend == "zero3":
        result["local_numel"] = min(p.numel() for p in wrapped.module.parameters())
    else:
        result["local_numel"] = min(p.to_local().numel() for p in model.parameters())
    result["full_numel"] = min(p.numel() for p in reference.parameters())

    # micro-step 1 (every rank its own batch)
    x1 = train_batch(100 + rank)
    wrapped.train()
    backward(wrapped(input_ids=x1, labels=x1).loss)
    before = full_grads()

    # the scoring pass: counts[rank] real probe batches, padded to the max over ranks
    n_local = config["counts"][rank]
    errors, calls = {}, {}
    for credit in ("oar-g", "oar-p"):
        scorer = get_credit(credit).score
        probes = [probe(1000 * rank + i) for i in range(n_local)]
        err, n_calls = 0.0, 0
        with full_policy(wrapped) as policy:
            for i, (p, real) in enumerate(pad_to_max_over_ranks(probes, dummy_probe())):
                got = scorer(policy, *p, **score_kwargs(credit, i))
                n_calls += 1
                if real:
                    want = scorer(reference, *p, **score_kwargs(credit, i))
                    assert want[p[2]].abs().sum() > 0, "the reference scores are all zero"
                    err = max(err, (got - want).abs().max().item())
        errors[credit], calls[credit] = err, n_calls
    after = full_grads()
    untouched = all(torch.equal(a, b) for a, b in zip(before, after, strict=True))

    # micro-step 2, then the reference gradient: the mean over ranks of both micro-steps' gradients
    x2 = train_batch(200 + rank)
    backward(wrapped(input_ids=x2, labels=x2).loss)
    grads = full_grads()
    reference.train()
    for r in range(world):
        for x in (train_batch(100 + r), train_batch(200 + r)):
            (reference(input_ids=x, labels=x).loss * grad_scale / world).backward()
    grad_err = max((g - p.grad).abs().max().item() for g, p in zip(grads, reference.parameters(), strict=True))

    step()
    flat = full_params()
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    result.update(
        score_error=errors, scorer_calls=calls, grads_untouched=untouched, grad_error=grad_err,
        identical=all(torch.equal(gathered[0], g) for g in gathered[1:]),
        moved=not torch.equal(flat, torch.cat([p.detach().flatten() for p in copy.deepcopy(tiny_lm(config["tie"]))
                                                .parameters()])),
    )
    write(result, out_path)


def write(result: dict, out_path: str) -> None:
    """Rank 0 writes the list of every rank's ``result``."""
    all_results = [None] * dist.get_world_size()
    dist.all_gather_object(all_results, result)
    if dist.get_rank() == 0:
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(all_results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's teardown (see fsdp_zero_trainer_worker.py)
