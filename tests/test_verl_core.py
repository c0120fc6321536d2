"""oar.integrations.verl.core: the verl plugin's framework-free pieces (no verl needed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from oar.credit import CreditBatch, token_credit
from oar.credit.metrics import METRIC_KEYS
from oar.integrations.verl.core import OARVerlConfig, active_rows, fold_credit, score_shard
from oar.probe import OutcomeProbe, rollout_tensors
from test_importance_perturbation import sharpen


def test_importing_oar_and_the_plugin_core_does_not_import_verl():
    """Meaningful in the verl environment (make test-verl), where verl is installed: oar's core stays torch-only."""
    code = "import sys, oar, oar.credit, oar.trainer, oar.integrations.verl.core; print('verl' in sys.modules)"
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr[-2000:]


def test_config_block_defaults_and_errors():
    cfg = OARVerlConfig.from_mapping({"credit": "oar-p@chunk_size=8", "batch_size": 4})
    assert (cfg.credit, dict(cfg.options), cfg.batch_size) == ("oar-p@chunk_size=8", {}, 4)
    assert cfg.resolved.method.name == "oar-p" and cfg.resolved.options["chunk_size"] == 8
    assert cfg.to_dict()["credit"] == "oar-p@chunk_size=8" and "options" not in cfg.to_dict()
    assert OARVerlConfig.from_mapping(cfg.to_dict()) == cfg  # what travels to the workers is the same config
    assert OARVerlConfig.from_mapping(None) == OARVerlConfig()
    with pytest.warns(FutureWarning, match=r"oar.options is deprecated.*\+oar.credit='oar-p@chunk_size=8'"):
        old = OARVerlConfig.from_mapping({"credit": "oar-p", "options": {"chunk_size": 8}, "batch_size": 4})
    assert old == cfg
    with pytest.raises(ValueError, match="unknown oar config key.*'bogus'"):
        OARVerlConfig.from_mapping({"bogus": 1})
    with pytest.raises(ValueError, match="unknown oar config key.*'resolved'"):
        OARVerlConfig.from_mapping({"resolved": 1})
    with pytest.raises(ValueError, match="no option"):
        OARVerlConfig.from_mapping({"credit": "oar-g@chunk_size=8"})
    with pytest.raises(ValueError, match="unknown credit"):
        OARVerlConfig.from_mapping({"credit": "oar"})
    with pytest.raises(ValueError, match="batch_size"):
        OARVerlConfig.from_mapping({"batch_size": 0})
    with pytest.raises(ValueError, match="noise_std must be > 0 unless mode is 'answer_joint'"):
        OARVerlConfig.from_mapping({"credit": "oar-g@noise_std=0&mode=last"})  # before any worker starts
    with pytest.raises(ValueError, match="samples continuations"):
        OARVerlConfig.from_mapping({"credit": "vine"})
    assert OARVerlConfig.from_mapping({"credit": "gtpo"}).resolved.method.needs_group  # group methods are offered


def test_active_rows_are_the_rows_with_nonzero_grpo_advantage():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.5])
    group = torch.tensor([7, 7, 3, 3, 9, 9])
    assert active_rows(rewards, group).tolist() == [True, True, False, False, True, True]


def _rollout(char_tokenizer, texts: list[str], prompt: str = "3+4="):
    tok = char_tokenizer
    p = [tok(prompt, add_special_tokens=False)["input_ids"]] * len(texts)
    return rollout_tensors(p, [tok(t, add_special_tokens=False)["input_ids"] for t in texts])


TEXTS = ["3+4 is 7, \\boxed{7}", "3 plus 4 gives 8, \\boxed{8}", "so 7, \\boxed{7}", "it is 7, \\boxed{7}"]


def test_score_then_fold_equals_token_credit_on_the_whole_batch(char_tokenizer, tiny_qwen2):
    """Scored in two shards, folded once: the same token advantages as oar's token_credit on the whole batch.

    OAR-P batches the copies of the rows it is given, so shards and whole batch agree to float rounding; the model is
    sharpened so that rounding is far below the scores (the min-max step of Bi-Level would magnify it on the ~1e-5
    scores of a random model)."""
    tiny_qwen2 = sharpen(tiny_qwen2)
    cfg = OARVerlConfig(credit="oar-p", batch_size=2)
    prompt_ids, prompt_mask, response_ids, response_mask = _rollout(char_tokenizer, TEXTS)
    adv_seq = torch.tensor([0.8, -1.2, 0.4, 0.0])
    active = adv_seq != 0
    parts = [score_shard(cfg, tiny_qwen2, char_tokenizer, prompt_ids[s], prompt_mask[s], response_ids[s],
                         response_mask[s], active[s]) for s in (slice(0, 2), slice(2, 4))]
    scores, mask = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    grpo = adv_seq[:, None] * response_mask  # verl's GRPO advantages: A on every response token
    folded, metrics = fold_credit(cfg, grpo, response_mask, scores, mask, active)

    probe = OutcomeProbe(char_tokenizer)
    want = token_credit("oar-p", CreditBatch(prompt_ids, prompt_mask, response_ids, response_mask, adv_seq,
                                             model=tiny_qwen2), active=active, probe=probe, batch_size=2)
    assert want.mask.any(), "the probe found no reasoning: the test would compare nothing"
    torch.testing.assert_close(folded, want.advantages(adv_seq) * response_mask, rtol=1e-3, atol=1e-5)
    # Bi-Level keeps each completion's advantage mass over its response
    torch.testing.assert_close(folded.sum(dim=1), grpo.sum(dim=1), rtol=1e-5, atol=1e-5)
    assert tuple(metrics) == METRIC_KEYS and metrics["oar/frac_scored"] == 0.75
    assert metrics["oar/weight_std"] > 0


def test_batch_level_effect_sees_the_whole_batch_not_a_micro_batch():
    """entropy-mask keeps the batch's top-20% tokens: folding per micro-batch would keep a different set."""
    cfg = OARVerlConfig(credit="entropy-mask")
    scores = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0], [0.1, 0.2, 0.3, 0.4, 0.5]])
    mask = torch.ones(2, 5, dtype=torch.bool)
    adv = torch.ones(2, 5)
    active = torch.tensor([True, True])
    whole, _ = fold_credit(cfg, adv, torch.ones(2, 5), scores, mask, active)
    assert whole[0].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0] and whole[1].sum() == 0
    per_row = torch.cat([fold_credit(cfg, adv[i : i + 1], torch.ones(1, 5), scores[i : i + 1], mask[i : i + 1],
                                     active[i : i + 1])[0] for i in range(2)])
    assert not torch.equal(per_row, whole)


def test_metric_schema_is_fixed_when_nothing_is_scored():
    cfg = OARVerlConfig()
    zeros = torch.zeros(3, 4)
    folded, metrics = fold_credit(cfg, zeros, torch.ones(3, 4), zeros, zeros.bool(), torch.zeros(3, dtype=torch.bool))
    assert tuple(metrics) == METRIC_KEYS and metrics["oar/frac_scored"] == 0.0 and metrics["oar/weight_mean"] == 1.0
    assert torch.equal(folded, zeros)


# --- methods that read whole rollout groups: gathered over the data-parallel ranks, scored together -------------

GROUP_TEXTS = ["3+4 is 7, \\boxed{7}", "3 plus 4 gives 8, \\boxed{8}", "so 7, \\boxed{7}", "it is 7 \\boxed{7}",
               "4+3 = 7 \\boxed{7}", "no, \\boxed{6}"]
GROUP_REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
GROUP_IDS = torch.tensor([10, 10, 11, 11, 12, 12])  # rollout groups of 2: group 11 spans both ranks' shards


def _group_rollout():
    from oar.lab.tokenizer import build_char_tokenizer

    return _rollout(build_char_tokenizer(), GROUP_TEXTS)


def _whole_batch_credit(credit: str, model=None):
    prompt_ids, prompt_mask, response_ids, response_mask = _group_rollout()
    adv = GROUP_REWARDS - GROUP_REWARDS.view(3, 2).mean(1).repeat_interleave(2)
    batch = CreditBatch(prompt_ids, prompt_mask, response_ids, response_mask, adv, rewards=GROUP_REWARDS,
                        group=GROUP_IDS, model=model)
    return token_credit(credit, batch, active=adv != 0), adv, response_mask


def test_a_group_method_scored_and_folded_equals_token_credit_on_the_whole_batch(char_tokenizer, tiny_qwen2):
    """gtpo reads the policy's entropy (actor) and the groups' rewards (its effect, on the driver): one shard on
    one rank, folded with the batch's group ids and rewards, gives token_credit's token advantages."""
    cfg = OARVerlConfig(credit="gtpo")
    prompt_ids, prompt_mask, response_ids, response_mask = _group_rollout()
    want, adv_seq, _ = _whole_batch_credit("gtpo", tiny_qwen2)
    active = adv_seq != 0
    with pytest.raises(ValueError, match="reads whole rollout groups"):
        score_shard(cfg, tiny_qwen2, char_tokenizer, prompt_ids, prompt_mask, response_ids, response_mask, active)
    scores, mask = score_shard(cfg, tiny_qwen2, char_tokenizer, prompt_ids, prompt_mask, response_ids, response_mask,
                               active, group_ids=GROUP_IDS, rewards=GROUP_REWARDS)
    grpo = adv_seq[:, None] * response_mask
    folded, metrics = fold_credit(cfg, grpo, response_mask, scores, mask, active, group_ids=GROUP_IDS,
                                  rewards=GROUP_REWARDS)
    assert want.mask.any() and (want.offsets != 0).any()
    torch.testing.assert_close(folded, want.advantages(adv_seq) * response_mask, rtol=1e-5, atol=1e-6)
    assert tuple(metrics) == METRIC_KEYS and metrics["oar/offset_abs_mean"] > 0


def _group_rank(rank: int, world: int, init: str, out: str) -> None:
    """One rank of the 2-process test: its half of the batch (trimmed to its own widths), scored with ktae."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        prompt_ids, prompt_mask, response_ids, response_mask = _group_rollout()
        rows = slice(3 * rank, 3 * rank + 3)
        T = int(response_mask[rows].sum(1).max())
        P = int(prompt_mask[rows].sum(1).max())  # prompts are left-padded: keep the last P columns
        adv = GROUP_REWARDS - GROUP_REWARDS.view(3, 2).mean(1).repeat_interleave(2)
        scores, mask = score_shard(OARVerlConfig(credit="ktae"), torch.nn.Linear(1, 1), None,
                                   prompt_ids[rows, -P:], prompt_mask[rows, -P:], response_ids[rows, :T],
                                   response_mask[rows, :T], (adv != 0)[rows], group_ids=GROUP_IDS[rows],
                                   rewards=GROUP_REWARDS[rows])
        torch.save({"scores": scores, "mask": mask}, f"{out}/rank{rank}.pt")
        dist.barrier()  # both ranks done with gloo before either tears it down (else gloo can abort a rank)
    finally:
        dist.destroy_process_group()


def test_group_method_shards_are_gathered_over_ranks_and_sliced_back(tmp_path):
    """Two gloo processes, each holding half of a batch whose second rollout group spans both: every rank scores
    the gathered batch (ktae's group statistics need whole groups) and keeps its own rows at its own width; the
    shards folded together equal token_credit on the whole batch."""
    import torch.multiprocessing as mp

    mp.spawn(_group_rank, args=(2, f"file://{tmp_path}/store", str(tmp_path)), nprocs=2, join=True)
    parts = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    want, adv_seq, response_mask = _whole_batch_credit("ktae")
    for r, part in enumerate(parts):
        T = part["scores"].shape[1]
        assert T == int(response_mask[3 * r : 3 * r + 3].sum(1).max()), "each rank keeps its own width"
        torch.testing.assert_close(part["scores"], want.scores[3 * r : 3 * r + 3, :T])
        assert torch.equal(part["mask"], want.mask[3 * r : 3 * r + 3, :T])
    assert parts[0]["scores"].shape[1] != parts[1]["scores"].shape[1], "the test pads shards of different widths"
    prompt_ids, prompt_mask, response_ids, response_mask = _group_rollout()
    alone = token_credit("ktae", CreditBatch(prompt_ids[3:], prompt_mask[3:], response_ids[3:], response_mask[3:],
                                             adv_seq[3:], rewards=GROUP_REWARDS[3:], group=GROUP_IDS[3:]))
    assert not torch.equal(alone.scores, want.scores[3:]), "a shard scored alone would see part of its group"
    T = response_mask.shape[1]
    scores = torch.cat([torch.nn.functional.pad(p["scores"], (0, T - p["scores"].shape[1])) for p in parts])
    mask = torch.cat([torch.nn.functional.pad(p["mask"], (0, T - p["mask"].shape[1])) for p in parts])
    active = adv_seq != 0
    folded, _ = fold_credit(OARVerlConfig(credit="ktae"), adv_seq[:, None] * response_mask, response_mask, scores,
                            mask, active, group_ids=GROUP_IDS, rewards=GROUP_REWARDS)
    assert (want.offsets != 0).any()
    torch.testing.assert_close(folded, want.advantages(adv_seq) * response_mask)
