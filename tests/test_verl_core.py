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
    cfg = OARVerlConfig.from_mapping({"credit": "oar-p", "options": {"chunk_size": 8}, "batch_size": 4})
    assert (cfg.credit, dict(cfg.options), cfg.batch_size) == ("oar-p", {"chunk_size": 8}, 4)
    assert OARVerlConfig.from_mapping(None) == OARVerlConfig()
    with pytest.raises(ValueError, match="unknown oar config key.*'bogus'"):
        OARVerlConfig.from_mapping({"bogus": 1})
    with pytest.raises(ValueError, match="no option"):
        OARVerlConfig.from_mapping({"credit": "oar-g", "options": {"chunk_size": 8}})
    with pytest.raises(ValueError, match="unknown credit"):
        OARVerlConfig.from_mapping({"credit": "oar"})
    with pytest.raises(ValueError, match="batch_size"):
        OARVerlConfig.from_mapping({"batch_size": 0})
    with pytest.raises(ValueError, match="whole rollout groups"):
        OARVerlConfig.from_mapping({"credit": "gtpo"})


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
