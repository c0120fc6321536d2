"""verl glue (imports verl, Ray and TransferQueue): the ``oar_sync`` v1 trainer and its actor worker.

* :class:`OARActorRolloutRefWorker`: verl's ``ActorRolloutRefWorker`` plus ``compute_oar_scores``, dispatched on
  the actor mesh like ``compute_log_prob`` (each data-parallel rank gets the same shard); it scores the shard with
  the engine's module (:func:`oar.integrations.verl.core.score_shard`) and returns ``oar_scores`` / ``oar_mask``.
* :class:`OARTrainerSync`: verl's ``PPOTrainerSync`` with the actor role mapped to that worker; after the old
  log-probs it marks the mixed-reward rows (and stores each row's group id and reward, for the methods that read
  whole groups) and calls ``compute_oar_scores``; after GRPO's advantages it folds the scores into them over the
  whole batch (:func:`oar.integrations.verl.core.fold_credit`).

Selected with ``trainer.v1.trainer_mode=oar_sync``; knobs in the top-level ``oar:`` block. The worker path needs a
GPU (verl's engines register CUDA/NPU devices only) and has not run in this repository's CI: see docs/scaling.md.
"""

from __future__ import annotations

import numpy as np
import ray
import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.padding import response_to_nested

from oar.credit.metrics import METRIC_KEYS
from oar.integrations.verl.core import OARVerlConfig, active_rows, fold_credit, score_shard, step_end_tokens

TRAINER_NAME = "oar_sync"
ACTOR_ROLES = (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor)


def padded(nested: torch.Tensor, pad: float | int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A jagged nested ``[B, *]`` tensor as a right-padded ``[B, L]`` tensor and its 0/1 mask."""
    lengths = nested.offsets().diff()
    values = nested.to_padded_tensor(pad)
    mask = (torch.arange(values.shape[1], device=values.device)[None, :] < lengths[:, None].to(values.device))
    return values, mask.long()


class OARActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's actor worker with the OAR scoring pass."""

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_oar_scores(self, data: TensorDict) -> TensorDict:
        """``oar_scores`` / ``oar_mask`` (nested, response length) for this rank's shard of the batch."""
        cfg = OARVerlConfig.from_mapping(tu.get(data, key="oar_config"))
        step = int(tu.get(data, key="oar_step", default=0))
        engine = self.actor.engine
        tokenizer = self.actor.model_config.tokenizer
        pad_id = tokenizer.pad_token_id or 0
        prompt_ids, prompt_mask = padded(data["prompts"], pad_id)
        response_ids, response_mask = padded(data["responses"], pad_id)
        active = data["oar_active"].bool()
        group_ids, rewards = data["oar_group"].long(), data["oar_reward"].float()
        device = next(engine.module.parameters()).device
        rank = engine.get_data_parallel_rank()
        generator = torch.Generator(device=device).manual_seed(cfg.seed + 7919 * rank + 104729 * step)
        with engine.eval_mode():
            scores, mask = score_shard(
                cfg, engine.module, tokenizer, prompt_ids.to(device), prompt_mask.to(device),
                response_ids.to(device), response_mask.to(device), active.to(device), generator,
                group=engine.get_data_parallel_group(), group_ids=group_ids.to(device), rewards=rewards.to(device),
            )
        ends = step_end_tokens(cfg, tokenizer, response_ids, response_mask)  # the step rules' steps, for the driver
        out = {"oar_scores": response_to_nested(scores.float().cpu(), data["response_mask"]),
               "oar_mask": response_to_nested(mask.cpu(), data["response_mask"]),
               "oar_ends": response_to_nested(ends.cpu(), data["response_mask"])}
        return TensorDict(out, batch_size=[prompt_ids.shape[0]])


@register_trainer(TRAINER_NAME)
class OARTrainerSync(PPOTrainerSync):
    """``PPOTrainerSync`` with OAR token credit folded into GRPO's advantages."""

    def __init__(self, config, *args, **kwargs):
        self.oar = OARVerlConfig.from_mapping(config.get("oar"))  # bad knobs fail before any worker starts
        strategy = config.actor_rollout_ref.actor.strategy
        if strategy != "fsdp2":
            raise ValueError(f"the oar_sync trainer scores with the FSDP2 actor: set "
                             f"actor_rollout_ref.actor.strategy=fsdp2 (got {strategy!r})")
        super().__init__(config, *args, **kwargs)

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        for role in ACTOR_ROLES:
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(OARActorRolloutRefWorker)

    def _compute_old_log_prob(self, batch, metrics: dict):
        batch = super()._compute_old_log_prob(batch, metrics)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "rm_scores"])
        rewards = data["rm_scores"]
        rewards = padded(rewards)[0].sum(dim=1) if rewards.is_nested else rewards.reshape(len(batch), -1).sum(dim=1)
        _, group = np.unique(np.array([str(u) for u in tu.get(data, key="uid")]), return_inverse=True)
        group = torch.as_tensor(group, dtype=torch.long)
        active = active_rows(rewards.float(), group)
        fields = TensorDict({"oar_active": active, "oar_group": group, "oar_reward": rewards.float()},
                            batch_size=len(batch))
        batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
        batch.extra_info.update({"oar_config": self.oar.to_dict(), "oar_step": int(self.global_steps)})
        output = self.actor_rollout_wg.compute_oar_scores(batch)
        assert len(output) == len(batch)
        return batch

    def _compute_advantage(self, batch, metrics: dict):
        batch = super()._compute_advantage(batch, metrics)
        fields = ["advantages", "response_mask", "oar_scores", "oar_mask", "oar_ends", "oar_active", "oar_group",
                  "oar_reward"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        advantages, _ = padded(data["advantages"], 0.0)
        response_mask, _ = padded(data["response_mask"], 0)
        scores, _ = padded(data["oar_scores"], 0.0)
        mask, _ = padded(data["oar_mask"], 0)
        ends, _ = padded(data["oar_ends"], 0)
        folded, oar_metrics = fold_credit(self.oar, advantages, response_mask, scores, mask.bool(),
                                          data["oar_active"].bool(), group_ids=data["oar_group"].long(),
                                          rewards=data["oar_reward"].float(), ends=ends.bool())
        assert tuple(oar_metrics) == METRIC_KEYS
        metrics.update(oar_metrics)
        out = TensorDict({"advantages": response_to_nested(folded, data["response_mask"])}, batch_size=len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)
