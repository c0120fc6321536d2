"""OARConfig / OARGRPOTrainer: config validation, parity with TRL's GRPOTrainer, OAR per-token advantages."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math

import pytest
import torch

from trainer_setup import exact_reward, first_group_reward, grpo_kwargs, task_rows, warm_tiny_lm

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

from oar.attribution import read_records  # noqa: E402
from oar.credit import ResolvedCredit, credit_names, get_credit  # noqa: E402
from oar.probe import OutcomeProbe  # noqa: E402
from oar.trainer import OARConfig, OARGRPOTrainer  # noqa: E402


def _dataset(n: int = 32, seed: int = 3):
    return datasets.Dataset.from_list(task_rows(n, seed=seed))


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


class RecordingTrainer(OARGRPOTrainer):
    """Keeps every rollout batch handed to TRL's loss, and counts scorer calls and the rows they scored."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches, self.scored_rows, self.scorer_models = [], [], []
        method, options = self.args.resolved_credit
        if method.needs_probe:
            inner = method.score

            @functools.wraps(inner)
            def spy(model, input_ids, *rest, **kw):
                self.scored_rows.append(input_ids.shape[0])
                self.scorer_models.append(model)
                return inner(model, input_ids, *rest, **kw)

            self.args.resolved_credit = ResolvedCredit(dataclasses.replace(method, score=spy), options)

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.batches.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in out.items()})
        return out


# --- config -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, credit",
    [("credit", "oar", "oar-g"), ("oar_tau", 1.0, "oar-g"), ("oar_tau", 0.0, "oar-g"), ("oar_beta", -0.1, "oar-g"),
     ("oar_floor", 1.5, "oar-g"), ("probe_mode", "mean", "oar-g"), ("answer_source", "gold", "oar-g"),
     ("noise_std", -1.0, "oar-g"), ("oar_batch_size", 0, "oar-g"), ("oar_chunk_size", 0, "oar-p"),
     ("oar_dump_every", -1, "oar-g"), ("oar_max_probe_length", 1, "oar-g"), ("oar_batch_size", math.nan, "grpo")],
)
def test_config_rejects_bad_values_naming_the_field(tmp_path, field, value, credit):
    kw = {"credit": credit, field: value} if field != "credit" else {field: value}
    with pytest.raises(ValueError, match=field):
        OARConfig(**grpo_kwargs(str(tmp_path)), **kw)


def test_oar_g_defaults_and_the_noise_rule(tmp_path):
    """OAR-G's default is answer_joint without noise (noise_std None: the scorer resolves it); a KL outcome mode with
    noise 0 is refused for oar-g and for oar-pg's guide by the rule registered with the method."""
    kw = grpo_kwargs(str(tmp_path))
    opts = OARConfig(**kw, credit="oar-g").resolved_credit.options
    assert (opts["mode"], opts["noise_std"]) == ("answer_joint", None)
    OARConfig(**kw, credit="oar-g@noise_std=0")  # answer_joint: no noise needed
    assert OARConfig(**kw, credit="oar-g@mode=answer_mean").resolved_credit.options["noise_std"] is None
    with pytest.raises(ValueError, match="noise_std must be > 0 unless mode is 'answer_joint'"):
        OARConfig(**kw, credit="oar-g@noise_std=0&mode=last")
    with pytest.raises(ValueError, match="noise_std must be > 0 unless guide_mode is 'answer_joint'"):
        OARConfig(**kw, credit="oar-pg@noise_std=0")
    OARConfig(**kw, credit="oar-pg@noise_std=0&guide_mode=answer_joint")
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="unless mode is 'answer_joint'"):
        OARConfig(**kw, credit="oar-g", probe_mode="answer_mean", noise_std=0.0)  # the deprecated fields too


def test_one_credit_value_with_deprecated_aliases(tmp_path):
    """``credit`` carries the method and its options; the option fields and ``credit_options`` are deprecated
    aliases merged into it (a FutureWarning naming the replacement), then cleared: one spelling remains."""
    import warnings

    kw = grpo_kwargs(str(tmp_path))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        args = OARConfig(**kw, credit="OAR-P@horizon=2&chunk_size=64")
    assert not [w for w in seen if "oar" in w.filename], "the new form warns about nothing"
    assert args.credit == "oar-p@horizon=2&chunk_size=64"
    method, options = args.resolved_credit
    assert method is get_credit("oar-p")
    assert (options["horizon"], options["chunk_size"], options["tau"]) == (2, 64, 0.25)
    with pytest.warns(FutureWarning, match=r"OARConfig.credit_options, OARConfig.oar_tau are deprecated.*"
                                           r"credit='oar-p@horizon=2&chunk_size=64&tau=0.3'"):
        old = OARConfig(**kw, credit="oar-p@horizon=2", credit_options={"chunk_size": 64}, oar_tau=0.3)
    assert old.credit == "oar-p@horizon=2&chunk_size=64&tau=0.3"
    assert (old.credit_options, old.oar_tau, old.oar_beta) == (None, None, None)
    assert old.to_dict()["credit"] == old.credit
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="sets tau=0.5, and oar_tau sets tau=0.3"):
        OARConfig(**kw, credit="oar-g@tau=0.5", oar_tau=0.3)  # one way to set an option: two values are refused
    with pytest.warns(FutureWarning):  # an alias the credit does not declare is ignored (a recipe with --credit grpo)
        assert OARConfig(**kw, credit="grpo", probe_mode="answer_mean").credit == "grpo"
    # GRPO's sampling temperature is GRPO's: it no longer sets a credit's own temperature option
    with pytest.warns(UserWarning, match=r"credit='gtpo@temperature=0.7'"):
        gtpo = OARConfig(**{**kw, "temperature": 0.7}, credit="gtpo")
    assert gtpo.resolved_credit.options["temperature"] == 1.0
    assert OARConfig(**{**kw, "temperature": 0.7}, credit="gtpo@temperature=0.7").resolved_credit.options[
        "temperature"] == 0.7
    assert OARConfig(**{**kw, "temperature": 0.7}, credit="vine").resolved_credit.options["temperature"] is None


NONFINITE = (math.nan, math.inf, -math.inf)


def _numeric_options() -> list[tuple[str, str]]:
    """(credit, option) for every numeric option of every registered method (the lab's oracles included)."""
    import oar.lab  # noqa: F401

    return [(name, key) for name in credit_names() for key, spec in get_credit(name).specs.items()
            if spec.kind in (int, float)]


def test_every_numeric_option_is_finite_at_every_entry_point(tmp_path):
    """NaN, inf and -inf are refused for every numeric option of every method, in one line naming the option, by
    every way to give it: the credit text (OARConfig, oar compare columns, the verl config, token_credit), the
    deprecated credit_options dict and the deprecated option field."""
    import warnings

    from oar.credit import CreditSpec
    from oar.integrations.verl.core import OARVerlConfig
    from oar.lab.compare import credit_columns
    from oar.trainer import DEPRECATED_OPTION_FIELDS

    kw = grpo_kwargs(str(tmp_path))
    field_of = {option: name for name, option in DEPRECATED_OPTION_FIELDS.items()}
    pairs = _numeric_options()
    assert {("gtpo", "alpha1"), ("gtpo", "alpha2"), ("oar-g", "tau"), ("oracle-blame", "floor")} <= set(pairs)
    tried = 0
    for credit, key in pairs:
        for value in NONFINITE:
            text = f"{credit}@{key}={json.dumps(value)}"  # NaN, Infinity, -Infinity
            config = functools.partial(OARConfig, **kw)
            builds = [(lambda credit: CreditSpec.parse(credit).resolve(), {"credit": text}),
                      (config, {"credit": text}), (lambda credit: credit_columns((credit,)), {"credit": text}),
                      (config, {"credit": credit, "credit_options": {key: value}}),
                      (config, {"credit": credit, "credit_options": json.dumps({key: value})})]
            if not get_credit(credit).lab_only and not get_credit(credit).needs_rollout:
                builds.append((OARVerlConfig, {"credit": text}))
            if key in field_of:
                builds.append((config, {"credit": credit, field_of[key]: value}))
            for build, arguments in builds:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    with pytest.raises(ValueError) as err:
                        build(**arguments)
                message = str(err.value)
                assert key in message and ("finite" in message or "integer" in message) and "\n" not in message, \
                    (credit, key, value, message)
                tried += 1
    assert tried >= 3 * 5 * len(pairs)


def test_config_loads_from_yaml_with_trl_parser(tmp_path):
    cfg = tmp_path / "oar.yaml"
    cfg.write_text(f"output_dir: {tmp_path}\nuse_cpu: true\ncredit: oar-p@tau=0.3&mode=answer_joint\n"
                   "num_generations: 4\nper_device_train_batch_size: 4\nloss_type: dapo\n")
    (args,) = trl.TrlParser([OARConfig]).parse_args_and_config(["--config", str(cfg), "--loss_type", "bnpo"])
    assert isinstance(args, OARConfig)
    assert (args.credit, args.loss_type) == ("oar-p@tau=0.3&mode=answer_joint", "bnpo")
    assert (args.resolved_credit.options["tau"], args.resolved_credit.options["mode"]) == (0.3, "answer_joint")
    with pytest.warns(FutureWarning, match="oar_beta is deprecated"):  # a deprecated field still loads and merges
        (args,) = trl.TrlParser([OARConfig]).parse_args_and_config(["--config", str(cfg), "--oar_beta", "2.0"])
    assert args.credit == "oar-p@tau=0.3&mode=answer_joint&beta=2.0"
    cfg.write_text(f"output_dir: {tmp_path}\nuse_cpu: true\ncredit: nope\n")
    with pytest.raises(ValueError, match="credit"):
        trl.TrlParser([OARConfig]).parse_args_and_config(["--config", str(cfg)])


def test_lazy_top_level_exports():
    import oar

    assert oar.OARConfig is OARConfig and oar.OARGRPOTrainer is OARGRPOTrainer
    assert {"OARConfig", "OARGRPOTrainer"} <= set(dir(oar))


def test_trainer_refuses_a_plain_grpo_config(tmp_path, char_tokenizer):
    with pytest.raises(ValueError, match="OARConfig"):
        OARGRPOTrainer(model=warm_tiny_lm(char_tokenizer), reward_funcs=exact_reward,
                       args=trl.GRPOConfig(**grpo_kwargs(str(tmp_path))), train_dataset=_dataset(),
                       processing_class=char_tokenizer)


def test_reference_answers_need_their_column(tmp_path, char_tokenizer):
    with pytest.raises(ValueError, match="'gold'"):
        OARGRPOTrainer(model=warm_tiny_lm(char_tokenizer), reward_funcs=exact_reward,
                       args=OARConfig(**grpo_kwargs(str(tmp_path)), answer_source="reference", reference_column="gold"),
                       train_dataset=_dataset(), processing_class=char_tokenizer)


# --- parity with the peer ------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "bnpo"])
def test_credit_grpo_is_bit_identical_to_trl(tmp_path, char_tokenizer, loss_type):
    base = warm_tiny_lm(char_tokenizer)
    before = _params(base)
    kw = grpo_kwargs(str(tmp_path), loss_type=loss_type, max_steps=2)
    peer = trl.GRPOTrainer(model=copy.deepcopy(base), reward_funcs=exact_reward, args=trl.GRPOConfig(**kw),
                           train_dataset=_dataset(), processing_class=char_tokenizer)
    peer.train()
    ours = RecordingTrainer(model=copy.deepcopy(base), reward_funcs=exact_reward,
                            args=OARConfig(**kw, credit="grpo"), train_dataset=_dataset(),
                            processing_class=char_tokenizer)
    ours.train()

    # the adapter path really ran: [B, T] per-token advantages, some non-zero
    assert ours.batches and all(b["advantages"].dim() == 2 for b in ours.batches)
    assert any(b["advantages"].abs().sum() > 0 for b in ours.batches)
    p_peer, p_ours = _params(peer.model), _params(ours.model)
    assert any(not torch.equal(before[k], p_peer[k]) for k in before), "training did not move the parameters"
    for k in p_peer:
        assert torch.equal(p_peer[k], p_ours[k]), f"{k} differs from TRL's GRPOTrainer ({loss_type})"
    ours_logs = [h for h in ours.state.log_history if "loss" in h]
    peer_logs = [h for h in peer.state.log_history if "loss" in h]
    assert [h["loss"] for h in ours_logs] == [h["loss"] for h in peer_logs]
    assert all(h["oar/frac_uniform"] == 0.0 and h["oar/weight_std"] == 0.0 for h in ours_logs)


# --- OAR weights ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "credit, answer_source",
    [("oar-g", "completion"), ("oar-p", "reference"), ("entropy", "completion"), ("random", "completion")],
)
def test_oar_per_token_advantages(tmp_path, char_tokenizer, credit, answer_source, monkeypatch):
    import oar.credit.run

    probed = []  # the rows of every probe chunk (a chunk without an answer never reaches the scorer)
    probe_chunk = oar.credit.run._probe_chunk
    monkeypatch.setattr(oar.credit.run, "_probe_chunk", lambda m, b, idx, *a: (probed.extend(idx.tolist()),
                                                                             probe_chunk(m, b, idx, *a)))
    trainer = RecordingTrainer(
        model=warm_tiny_lm(char_tokenizer), reward_funcs=first_group_reward,
        args=OARConfig(**grpo_kwargs(str(tmp_path), max_steps=1), credit=credit, answer_source=answer_source,
                       oar_batch_size=3, oar_dump_every=1),
        train_dataset=_dataset(), processing_class=char_tokenizer,
    )
    trainer.train()
    (batch,) = trainer.batches
    adv, mask = batch["advantages"], batch["completion_mask"].bool()
    seq = adv[:, 0]  # token 0 is reasoning or not, but a row's advantage sign and zero-ness are per row
    active = (adv != 0).any(dim=1)
    assert 0 < int(active.sum()) < adv.shape[0], "test needs groups with and without reward variance"
    assert sorted(probed) == active.nonzero().squeeze(1).tolist(), "rows with zero advantage must not be scored"
    assert 0 < sum(trainer.scored_rows) <= int(active.sum()) and max(trainer.scored_rows) <= 3
    assert torch.equal(adv[~active], torch.zeros_like(adv[~active]))

    # where the reasoning is does not depend on the answer source
    probe = OutcomeProbe(char_tokenizer)(batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                                               batch["completion_mask"])
    reasoning = probe.completion_reasoning_mask & probe.valid[:, None] & active[:, None]
    reshaped = 0
    for i in reasoning.any(dim=1).nonzero().squeeze(1).tolist():
        a = adv[i][mask[i] & ~reasoning[i]]
        a_row = a[0] if a.numel() else seq[i]
        assert torch.allclose(a, a_row.expand_as(a)), "non-reasoning tokens keep the sequence advantage"
        w = adv[i][reasoning[i]] / a_row
        assert torch.all(w >= 0)
        assert torch.isclose(w.mean(), torch.tensor(1.0), atol=1e-5), "reasoning weights have mean 1"
        reshaped += int(w.std() > 1e-3)
    assert reshaped > 0, "no completion got non-uniform weights"

    logs = [h for h in trainer.state.log_history if "loss" in h]
    for key in ("oar/ess_ratio", "oar/weight_std", "oar/frac_uniform", "oar/frac_scored", "oar/importance_time",
                "oar/importance_share", "grad_norm", "oar/grad_clipped", "reward"):
        assert key in logs[0], key
    assert 0 < logs[0]["oar/ess_ratio"] < 1 and logs[0]["oar/weight_std"] > 0
    assert 0 < logs[0]["oar/importance_share"] < 1
    assert logs[0]["oar/frac_scored"] == pytest.approx(float(active.float().mean()))

    # the attribution dump: the first scored completions, their tokens joining to the decoded completion and
    # TRL's reward for it
    records = read_records(tmp_path / "attributions.jsonl")
    scored = active.nonzero().squeeze(1).tolist()[:4]
    assert len(records) == len(scored)
    for rec, i in zip(records, scored, strict=True):
        ids = batch["completion_ids"][i][mask[i]].tolist()
        assert rec.prompt == char_tokenizer.decode(batch["prompt_ids"][i][batch["prompt_mask"][i].bool()])
        assert "".join(rec.tokens) == char_tokenizer.decode(ids, skip_special_tokens=False)
        assert rec.reward == float(i == 0)  # first_group_reward
        assert rec.advantage == pytest.approx(float(adv[i][mask[i] & ~reasoning[i]][0]))


def test_weights_reused_across_iterations_and_accumulation(tmp_path, char_tokenizer):
    trainer = RecordingTrainer(
        model=warm_tiny_lm(char_tokenizer), reward_funcs=exact_reward,
        args=OARConfig(**grpo_kwargs(str(tmp_path), max_steps=2, per_device_train_batch_size=4,
                                     gradient_accumulation_steps=2, num_iterations=2, max_grad_norm=1e-6),
                       credit="oar-g"),
        train_dataset=_dataset(), processing_class=char_tokenizer,
    )
    before = _params(trainer.model)
    trainer.train()
    assert len(trainer.batches) == 1, "one rollout batch feeds 2 accumulation steps x 2 iterations"
    assert sum(trainer.scored_rows) == int((trainer.batches[0]["advantages"] != 0).any(dim=1).sum())
    assert trainer.batches[0]["old_per_token_logps"] is not None
    after = _params(trainer.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["oar/grad_clipped"] for h in logs] == [1.0, 1.0], "grad_norm > max_grad_norm must be flagged"


def test_every_loss_type_takes_token_advantages(tmp_path, char_tokenizer):
    """Gradients under each TRL loss differ between OAR advantages and their uniform (GRPO) counterpart."""
    trainer = RecordingTrainer(
        model=warm_tiny_lm(char_tokenizer), reward_funcs=exact_reward,
        args=OARConfig(**grpo_kwargs(str(tmp_path), max_steps=1), credit="oar-g"),
        train_dataset=_dataset(), processing_class=char_tokenizer,
    )
    trainer.train()
    batch = dict(trainer.batches[0])
    uniform = dict(batch)
    rows = batch["advantages"]
    mask = batch["completion_mask"].bool()
    uniform["advantages"] = torch.where(mask, rows, 0).sum(1) / mask.sum(1).clamp_min(1)  # [B]: A (mean weight 1)
    model = trainer.model
    for loss_type in ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "vespo"):
        trainer.loss_type = loss_type
        grads = []
        for inputs in (batch, uniform):
            model.zero_grad()
            loss = trainer.compute_loss(model, inputs)
            loss.backward()
            assert torch.isfinite(loss), loss_type
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        assert grads[0].abs().sum() > 0, loss_type
        assert not torch.allclose(grads[0], grads[1]), f"{loss_type}: token weights had no effect"


def test_lora_with_kl_scores_through_the_adapter(tmp_path, char_tokenizer):
    peft = pytest.importorskip("peft")
    trainer = RecordingTrainer(
        model=warm_tiny_lm(char_tokenizer), reward_funcs=exact_reward,
        args=OARConfig(**grpo_kwargs(str(tmp_path), max_steps=2, beta=0.05, learning_rate=1e-2), credit="oar-g"),
        train_dataset=_dataset(), processing_class=char_tokenizer,
        peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    lora_before = {k: v.clone() for k, v in _params(trainer.model).items() if "lora_B" in k}
    trainer.train()
    assert trainer.scorer_models and all(isinstance(m, peft.PeftModel) for m in trainer.scorer_models)
    assert all("ref_per_token_logps" in b for b in trainer.batches)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert all("kl" in h and h["kl"] is not None for h in logs)
    after = _params(trainer.model)
    assert any(not torch.equal(v, after[k]) for k, v in lora_before.items()), "the adapter did not train"


# --- checkpoints ---------------------------------------------------------------------------------------


def test_checkpoints_appear_only_when_complete(tmp_path, char_tokenizer, monkeypatch):
    from transformers.trainer_utils import get_last_checkpoint

    from oar.checkpoints import last_checkpoint

    def trainer(max_steps):
        kw = grpo_kwargs(str(tmp_path), max_steps=max_steps, save_strategy="steps", save_steps=1, save_total_limit=2)
        return OARGRPOTrainer(model=warm_tiny_lm(char_tokenizer), reward_funcs=exact_reward,
                              args=OARConfig(**kw, credit="grpo"), train_dataset=_dataset(),
                              processing_class=char_tokenizer)

    def entries():
        return sorted(p.name for p in tmp_path.iterdir() if "checkpoint" in p.name)

    trainer(3).train()
    assert entries() == ["checkpoint-2", "checkpoint-3"], "rotation keeps 2; nothing left in staging"
    inode = (tmp_path / "checkpoint-3").stat().st_ino

    # resumed from step 2: checkpoint-3 is written again (replacing the old one), then saving step 4 crashes
    crashing = trainer(4)
    save_rng_state = crashing._save_rng_state

    def crash(output_dir):
        if crashing.state.global_step == 4:
            raise RuntimeError("disk full")
        save_rng_state(output_dir)

    monkeypatch.setattr(crashing, "_save_rng_state", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        crashing.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert entries() == [".checkpoint-staging", "checkpoint-2", "checkpoint-3"]
    assert (tmp_path / ".checkpoint-staging" / "checkpoint-4" / "model.safetensors").is_file()
    assert (tmp_path / "checkpoint-3").stat().st_ino != inode
    assert last_checkpoint(tmp_path) == get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-3")

    trainer(4).train(resume_from_checkpoint=last_checkpoint(tmp_path))
    assert entries() == ["checkpoint-3", "checkpoint-4"]
    assert json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())["global_step"] == 4


# --- every registered credit method (and the controls) runs in the trainer ------------------------------


@pytest.mark.parametrize("credit", ["entropy-mask", "gtpo", "ktae", "cf-span", "oar-pg", "shuffle:oar-g",
                                    "inverted:oar-p", "shuffle:ktae", "inverted:entropy-mask"])
def test_every_credit_method_trains(tmp_path, char_tokenizer, credit):
    from oar.credit import get_credit

    trainer = RecordingTrainer(
        model=warm_tiny_lm(char_tokenizer), reward_funcs=first_group_reward,
        args=OARConfig(**grpo_kwargs(str(tmp_path), max_steps=1), credit=credit, oar_dump_every=1),
        train_dataset=_dataset(), processing_class=char_tokenizer,
    )
    trainer.train()
    (batch,) = trainer.batches
    adv, mask = batch["advantages"], batch["completion_mask"].bool()
    active = (adv != 0).any(dim=1)
    assert torch.isfinite(adv).all() and active.any()
    assert torch.equal(adv[~active], torch.zeros_like(adv[~active])), "zero-advantage rows stay zero"
    method = get_credit(credit)
    uniform = adv[active][mask[active]]
    assert uniform.std() > 0, f"{credit}: the token advantages of a scored row must not all be equal"
    if method.combine == "mask":
        first = adv[0][mask[0]]
        assert set(first.unique().tolist()) <= {0.0, float(first.abs().max())} or set(
            first.unique().tolist()) <= {0.0, -float(first.abs().max())}
    logs = [h for h in trainer.state.log_history if "loss" in h]
    from oar.credit.metrics import METRIC_KEYS

    assert set(METRIC_KEYS) <= set(logs[0]), "the TRL trainer logs the schema the verl plugin logs"
    # the rewards the credit reads come from the _calculate_rewards override: TRL's own per-function rewards
    kept = trainer._rewards.per_func
    assert kept.shape == (adv.shape[0], 1)
    assert kept[:, 0].tolist() == list(trainer._logs["rewards"][trainer.reward_func_names[0]])[-adv.shape[0]:]
    records = read_records(tmp_path / "attributions.jsonl")
    assert records and all(r.credit == method.name for r in records)
    assert [r.reward for r in records] == [float(kept[i, 0]) for i in active.nonzero().squeeze(1).tolist()[:4]]
    if method.combine in ("add", "replace"):
        assert all(r.offsets is not None for r in records)


def test_rollout_rewards_are_sliced_and_weighted_once():
    from oar.trl_rollout import RolloutRewards, reward_total

    nan, inf = math.nan, math.inf
    per_func = torch.tensor([[1.0, 0.5], [nan, 1.0], [nan, nan], [0.0, inf]])
    r = RolloutRewards(per_func, torch.tensor([2.0, 1.0]))
    assert reward_total(per_func, r.weights).tolist() == [2.5, 1.0, 0.0, inf]  # TRL's NaN-skipping sum
    total = r.total()
    assert total[:2].tolist() == [2.5, 1.0] and math.isnan(total[2]) and total[3] == inf  # NaN: nothing scored it
    assert r.nonfinite().tolist() == [False, False, True, True]
    assert torch.allclose(r.local(1, 2).per_func, per_func[2:], equal_nan=True)
    assert torch.allclose(r.local(0, 2).per_func, per_func[:2], equal_nan=True)
    with pytest.raises(RuntimeError, match="rewards of 4 completions"):
        r.local(2, 2)


def test_oar_state_goes_through_the_checkpoint_files(tmp_path):
    from oar.checkpoints import load_oar_state, save_oar_state
    from oar.trainer import OARState

    state = OARState(torch.Generator().manual_seed(3), rollouts=5)
    save_oar_state(state, str(tmp_path), rank=1)
    draws = torch.rand(4, generator=state.generator)
    again = OARState(torch.Generator().manual_seed(0))
    load_oar_state(again, str(tmp_path), rank=1)
    assert again.rollouts == 5 and torch.equal(torch.rand(4, generator=again.generator), draws)
    assert (tmp_path / "oar_state_1.pth").is_file()


def test_a_credit_registered_in_user_code_trains_without_editing_oar(tmp_path, char_tokenizer):
    from oar.credit import register_credit, unregister_credit

    @register_credit("t-first-tokens", combine="multiply", needs_policy=False, needs_probe=False, passes="0",
                     paper="test", summary="double the first k completion tokens", options={"k": 3},
                     effect=lambda scores, mask: torch.where(mask, 1 + scores, torch.ones_like(scores)))
    def first_tokens(batch, k=3):
        return (torch.arange(batch.completion_ids.shape[1]) < k).float().expand(batch.completion_ids.shape[0], -1)

    try:
        trainer = RecordingTrainer(
            model=warm_tiny_lm(char_tokenizer), reward_funcs=first_group_reward,
            args=OARConfig(**grpo_kwargs(str(tmp_path), max_steps=1), credit="t-first-tokens@k=2"),
            train_dataset=_dataset(), processing_class=char_tokenizer,
        )
        trainer.train()
        adv = trainer.batches[0]["advantages"]
        row = adv[(adv != 0).any(dim=1)][0]
        assert torch.allclose(row[:2], 2 * row[2]) and torch.allclose(row[3:], row[2].expand_as(row[3:]))
        with pytest.raises(ValueError, match=r"no option\(s\) \['j'\]"):
            OARConfig(**grpo_kwargs(str(tmp_path)), credit="t-first-tokens@j=1")
    finally:
        unregister_credit("t-first-tokens")
    with pytest.raises(ValueError, match="unknown credit 't-first-tokens'; registered: grpo"):
        OARConfig(**grpo_kwargs(str(tmp_path)), credit="t-first-tokens")


@pytest.mark.parametrize("credit", ["oar-p", "entropy-mask"])
def test_trainer_dump_equals_attribute_for_the_same_completions(tmp_path, char_tokenizer, credit):
    """The trainer and ``oar attribute`` run the same token_credit: equal weights and scores on equal inputs."""
    from oar.attribution import attribute_batch

    model = warm_tiny_lm(char_tokenizer)
    scorer_copy = copy.deepcopy(model)  # the policy as it was when the rollout batch was scored
    trainer = RecordingTrainer(
        model=model, reward_funcs=first_group_reward,
        args=OARConfig(**grpo_kwargs(str(tmp_path), max_steps=1), credit=credit, oar_dump_every=1,
                       oar_dump_count=8),
        train_dataset=_dataset(), processing_class=char_tokenizer,
    )
    trainer.train()
    records = read_records(tmp_path / "attributions.jsonl")
    assert records
    eos = char_tokenizer.eos_token
    texts = ["".join(r.tokens) for r in records]
    assert all(t.endswith(eos) or len(t) >= 20 for t in texts)
    completions = [t[: -len(eos)] if t.endswith(eos) else t for t in texts]
    again = attribute_batch(scorer_copy, char_tokenizer, [r.prompt for r in records], completions, credit)
    for rec, att in zip(records, again, strict=True):
        n = len(att.tokens)  # the dump also holds the eos token (weight 1, not reasoning)
        assert rec.reasoning[:n] == att.reasoning
        if credit == "entropy-mask":  # its quantile is over the batch: compare the per-token signal
            assert rec.scores[:n] == pytest.approx(att.scores, rel=1e-4, abs=1e-5)
        else:
            assert rec.scores[:n] == pytest.approx(att.scores, rel=1e-4, abs=1e-6)
            assert rec.weights[:n] == pytest.approx(att.weights, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize(
    "kw, message",
    [({"oar_beta": -1}, "oar_beta must be >= 0, got -1"),
     ({"credit_options": {"beta": -1}}, "credit 'oar-g': beta must be >= 0, got -1"),
     ({"credit": "oar-g@beta=-1"}, "credit 'oar-g': beta must be >= 0, got -1"),
     ({"credit": "oar-p@chunk_size=0"}, "credit 'oar-p': chunk_size must be >= 1, got 0"),
     ({"oar_tau": 1.5}, "oar_tau must be in (0, 1), got 1.5"),
     ({"credit_options": {"tau": 1.5}}, "credit 'oar-g': tau must be in (0, 1), got 1.5"),
     ({"credit_options": {"floor": "0.5"}}, "credit 'oar-g': floor must be a number, got '0.5'"),
     ({"credit": "oar-p", "oar_chunk_size": 0}, "oar_chunk_size must be >= 1, got 0"),
     ({"credit": "oar-p", "credit_options": {"chunk_size": 0}}, "credit 'oar-p': chunk_size must be >= 1, got 0"),
     ({"credit": "oar-p", "credit_options": {"horizon": -2}}, "credit 'oar-p': horizon must be >= 0, got -2"),
     ({"credit": "entropy-mask", "credit_options": {"rho": 0}}, "credit 'entropy-mask': rho must be in (0, 1]")],
)
def test_options_are_checked_once_whether_a_field_or_credit_options_sets_them(tmp_path, kw, message):
    """An option's declaration (type and range, oar.credit.catalogue; τ/β/floor ranges from oar.reshape) refuses
    a bad value when OARConfig is built, the same one-line error by either route."""
    kw = {"credit": "oar-g", **kw}
    with pytest.raises(ValueError) as err:
        OARConfig(**grpo_kwargs(str(tmp_path)), **kw)
    assert str(err.value) == message or str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)
