"""The verl plugin against verl itself, on CPU: entry-point registration, the hydra config path, and one step of
the ``oar_sync`` trainer's OAR stages with verl's own GRPO estimator, with TransferQueue replaced by an in-memory
store and the Ray worker group by a direct call of the worker method on a tiny model (verl's engines and Ray
workers need a GPU: ``make gpu-verl``).

verl 0.9.1 pins transformers < 5.11, so this runs in its own environment (``make test-verl``); in oar's main
environment verl is absent and the module is skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="verl lives in its own environment (transformers < 5.11): make test-verl")

from tensordict import NonTensorStack, TensorDict  # noqa: E402
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import get_trainer_cls  # noqa: E402
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402

from oar.credit import CreditBatch, token_credit  # noqa: E402
from oar.credit.metrics import METRIC_KEYS  # noqa: E402
from oar.integrations.verl import trainer as plugin  # noqa: E402
from oar.integrations.verl.core import OARVerlConfig  # noqa: E402
from oar.probe import OutcomeProbe  # noqa: E402

CHECK = """
import verl
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
print("REGISTERED" if "oar_sync" in TRAINER_REGISTRY else "ABSENT")
"""


@pytest.mark.parametrize("policy,expected", [("auto", "REGISTERED"), ("none", "ABSENT")])
def test_import_verl_registers_the_trainer_through_the_entry_point_and_says_so(policy, expected):
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": policy, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == expected
    loud = "oar verl plugin: registered trainer 'oar_sync'" in proc.stderr
    assert loud == (expected == "REGISTERED"), proc.stderr[-3000:]


def test_registered_class_is_a_sync_v1_trainer():
    cls = get_trainer_cls("oar_sync")
    assert cls is plugin.OARTrainerSync and issubclass(cls, PPOTrainerSync)


def _verl_config(*overrides: str):
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


def test_hydra_command_line_selects_the_trainer_and_carries_the_oar_block():
    cfg = _verl_config("algorithm.adv_estimator=grpo", "trainer.v1.trainer_mode=oar_sync",
                       "+oar.credit='oar-p@chunk_size=8&horizon=2'", "+oar.batch_size=4")
    assert get_trainer_cls(cfg.trainer.v1.trainer_mode) is plugin.OARTrainerSync
    oar = OARVerlConfig.from_mapping(cfg.oar)
    assert (oar.credit, oar.batch_size) == ("oar-p@chunk_size=8&horizon=2", 4)
    assert (oar.resolved.options["chunk_size"], oar.resolved.options["horizon"]) == (8, 2)
    old = _verl_config("trainer.v1.trainer_mode=oar_sync", "+oar.credit=oar-p", "+oar.options.chunk_size=8")
    with pytest.warns(FutureWarning, match="oar.options is deprecated"):
        assert OARVerlConfig.from_mapping(old.oar).credit == "oar-p@chunk_size=8"
    bad = _verl_config("trainer.v1.trainer_mode=oar_sync", "+oar.credit=oar-g", "+oar.noise=0.1")
    with pytest.raises(ValueError, match="unknown oar config key.*'noise'"):
        plugin.OARTrainerSync(bad)  # refused before verl starts anything
    fsdp1 = _verl_config("trainer.v1.trainer_mode=oar_sync", "+oar.credit=oar-g")  # verl's default actor: fsdp
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.strategy=fsdp2"):
        plugin.OARTrainerSync(fsdp1)


# --- one step of the OAR stages, verl's TransferQueue and Ray replaced -----------------------------------------

def nested(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


class Store:
    """TransferQueue's ``kv_batch_get`` / ``kv_batch_put`` over one in-memory batch."""

    def __init__(self, fields: dict):
        self.fields = dict(fields)

    def kv_batch_get(self, keys, partition_id, select_fields):
        return TensorDict({k: self.fields[k] for k in select_fields}, batch_size=len(keys))

    def kv_batch_put(self, keys, partition_id, fields):
        self.fields.update({k: fields[k] for k in fields.keys()})
        return Meta(keys, partition_id)


class Meta:
    def __init__(self, keys, partition_id="train"):
        self.keys, self.partition_id, self.extra_info = keys, partition_id, {}

    def __len__(self):
        return len(self.keys)


class WorkerGroup:
    """``actor_rollout_wg``: runs the worker's ``compute_oar_scores`` on two data-parallel shards in-process."""

    def __init__(self, store: Store, model, tokenizer):
        engine = SimpleNamespace(module=model, eval_mode=nullcontext, get_data_parallel_rank=lambda: 0,
                                 get_data_parallel_group=lambda: None)
        self.worker = SimpleNamespace(actor=SimpleNamespace(engine=engine,
                                                            model_config=SimpleNamespace(tokenizer=tokenizer)))
        self.store = store
        self.calls = 0

    def compute_oar_scores(self, batch: Meta):
        B = len(batch)
        outs = []
        for shard in (range(0, B // 2), range(B // 2, B)):
            idx = list(shard)
            data = TensorDict({k: nested([self.store.fields[k][i] for i in idx]) for k in
                               ("prompts", "responses", "response_mask")}, batch_size=len(idx))
            for key in ("oar_active", "oar_group", "oar_reward"):
                data[key] = self.store.fields[key][idx]
            tu.assign_non_tensor(data, **batch.extra_info)
            outs.append(plugin.OARActorRolloutRefWorker.compute_oar_scores(self.worker, data))
            self.calls += 1
        for key in ("oar_scores", "oar_mask", "oar_ends"):
            self.store.fields[key] = nested([row for out in outs for row in out[key].unbind()])
        return list(range(B))


def test_one_step_folds_actor_scores_into_verls_grpo_advantages(monkeypatch, char_tokenizer, tiny_qwen2):
    tok = char_tokenizer
    texts = ["3+4 is 7, \\boxed{7}", "3 plus 4 gives 8, \\boxed{8}", "so 7, \\boxed{7}", "it is 7, \\boxed{7}"]
    rewards = [1.0, 0.0, 1.0, 1.0]
    prompt = tok("3+4=", add_special_tokens=False)["input_ids"]
    responses = [torch.tensor(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    rm = [torch.zeros(len(r)) for r in responses]
    for row, r in zip(rm, rewards, strict=True):
        row[-1] = r
    uid = np.array(["a", "a", "b", "b"], dtype=object)  # group b is all-correct: not scored
    store = Store({"prompts": nested([torch.tensor(prompt)] * 4), "responses": nested(responses),
                   "response_mask": nested([torch.ones(len(r), dtype=torch.long) for r in responses]),
                   "rm_scores": nested(rm), "uid": NonTensorStack(*uid.tolist())})

    def grpo_stage(self, batch, metrics):  # what verl's _compute_advantage writes, with verl's own estimator
        resp_mask = plugin.padded(store.fields["response_mask"])[0]
        adv, _ = compute_grpo_outcome_advantage(plugin.padded(store.fields["rm_scores"], 0.0)[0], resp_mask, uid)
        return store.kv_batch_put(batch.keys, batch.partition_id,
                                  TensorDict({"advantages": nested([a[: len(r)] for a, r in zip(adv, responses,
                                                                                                 strict=True)])},
                                             batch_size=4))

    monkeypatch.setattr(plugin, "tq", store)
    monkeypatch.setattr(PPOTrainerSync, "_compute_old_log_prob", lambda self, batch, metrics: batch)
    monkeypatch.setattr(PPOTrainerSync, "_compute_advantage", grpo_stage)
    trainer = object.__new__(plugin.OARTrainerSync)  # verl's own CPU tests build stub trainers this way
    trainer.oar = OARVerlConfig(credit="oar-p", batch_size=1)
    trainer.global_steps = 1
    trainer.actor_rollout_wg = WorkerGroup(store, tiny_qwen2, tok)
    metrics: dict = {}
    batch = trainer._compute_old_log_prob(Meta(list(range(4))), metrics)
    assert store.fields["oar_active"].tolist() == [True, True, False, False]
    assert trainer.actor_rollout_wg.calls == 2
    trainer._compute_advantage(batch, metrics)

    folded = plugin.padded(store.fields["advantages"], 0.0)[0]
    resp_mask = plugin.padded(store.fields["response_mask"])[0]
    grpo = compute_grpo_outcome_advantage(plugin.padded(store.fields["rm_scores"], 0.0)[0], resp_mask, uid)[0]
    seq = grpo[:, 0]
    response_ids = plugin.padded(store.fields["responses"])[0]
    want = token_credit("oar-p", CreditBatch(torch.tensor([prompt] * 4), torch.ones(4, len(prompt), dtype=torch.long),
                                             response_ids, resp_mask, seq, model=tiny_qwen2),
                        active=seq != 0, probe=OutcomeProbe(tok), batch_size=1)
    assert want.mask.any()
    torch.testing.assert_close(folded, want.advantages(seq) * resp_mask, rtol=0, atol=1e-5)
    assert not torch.equal(folded, grpo), "the OAR weights changed nothing"
    assert set(METRIC_KEYS) <= set(metrics) and metrics["oar/frac_scored"] == 0.5
