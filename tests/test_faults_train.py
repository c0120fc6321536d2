"""Fault injection on ``oar train`` (tiny local model): exact resume, the max_steps edge, changed settings on
resume, non-finite rewards, and every bad input answered by one ``oar train: error:`` line naming it."""

from __future__ import annotations

import json
import logging
import math
import types
from pathlib import Path

import pytest
import torch

from trainer_setup import task_rows, warm_tiny_lm

pytest.importorskip("trl")

from transformers import TrainerCallback  # noqa: E402

from oar.checkpoints import last_checkpoint  # noqa: E402
from oar.cli import main  # noqa: E402
from oar.files import read_jsonl  # noqa: E402
from oar.train_run import parse_train_args, run_training  # noqa: E402


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, char_tokenizer):
    """A saved tiny model directory, a JSONL dataset and a YAML config (constant learning rate)."""
    root = tmp_path_factory.mktemp("faults")
    model_dir = root / "tiny"
    warm_tiny_lm(char_tokenizer).save_pretrained(model_dir)
    char_tokenizer.save_pretrained(model_dir)
    data = root / "add.jsonl"
    data.write_text("".join(json.dumps({"question": r["prompt"], "gold": r["answer"]}) + "\n"
                            for r in task_rows(24, seed=11)))
    config = root / "train.yaml"
    config.write_text(
        f"model: {model_dir}\ndataset: {data}\nprompt_column: question\nanswer_column: gold\n"
        "prompt_template: '{question}'\nper_device_train_batch_size: 8\nnum_generations: 4\n"
        "max_completion_length: 24\nlearning_rate: 0.001\nlr_scheduler_type: constant\nlogging_steps: 1\n"
        "save_steps: 2\nreport_to: none\nseed: 0\ndisable_tqdm: true\n"
    )
    return root, config


class _Crash(TrainerCallback):
    """Raises at the start of step ``at`` (1-based), as a kill there would stop the run; ``after_update``: at its
    end instead (its rollout drawn and dumped, its update made, its checkpoint not yet saved)."""

    def __init__(self, at: int, after_update: bool = False) -> None:
        self.at, self.after_update = at, after_update

    def on_step_begin(self, args, state, control, **kwargs):
        if not self.after_update and state.global_step + 1 == self.at:
            raise KeyboardInterrupt(f"crash before step {self.at}")

    def on_step_end(self, args, state, control, **kwargs):
        if self.after_update and state.global_step == self.at:
            raise KeyboardInterrupt(f"crash at the end of step {self.at}")


def _one_error_line(stderr: str) -> str:
    """The ``oar train: error:`` line, asserting it is the last line and no traceback came before it
    (progress bars of datasets/transformers may)."""
    lines = stderr.strip().splitlines()
    assert lines and lines[-1].startswith("oar train: error:"), stderr[-3000:]
    assert "Traceback" not in stderr and sum("error:" in line for line in lines) == 1, stderr[-3000:]
    return lines[-1]


def _train(config, out, *extra, callbacks=None):
    script, cfg = parse_train_args(["--config", str(config), "--output_dir", str(out), *extra])
    return run_training(script, cfg, callbacks=callbacks)


def _weights(out) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "model.safetensors"))


@pytest.mark.parametrize("credit", ["oar-g", "random"])
def test_resume_after_a_crash_is_the_uninterrupted_run(workspace, credit):
    """The scorer's generator and the rollout counter are checkpointed: crash at the end of step 4 (after the
    rollout of step 4 was dumped, before checkpoint-4), resume from checkpoint-2, and the final weights, the logged
    losses and the attribution dumps (every rollout batch that scored any completion) equal the uninterrupted run's
    bit for bit: the dumps drawn at steps 3-4 are written once (the resume drops the dumps past the checkpoint, as it
    drops the metrics)."""
    root, config = workspace
    common = ["--credit", credit, "--max_steps", "4", "--oar_dump_every", "1", "--oar_dump_count", "2"]
    _train(config, root / f"{credit}-full", *common)
    full_steps = [d["step"] for d in read_jsonl(root / f"{credit}-full" / "attributions.jsonl")]
    assert {2, 3} & set(full_steps), "a rollout past checkpoint-2 was dumped (else the test checks nothing)"
    with pytest.raises(KeyboardInterrupt):
        _train(config, root / f"{credit}-crash", *common, callbacks=[_Crash(at=4, after_update=True)])
    assert [d["step"] for d in read_jsonl(root / f"{credit}-crash" / "attributions.jsonl")] == full_steps
    assert last_checkpoint(root / f"{credit}-crash").endswith("checkpoint-2")
    _train(config, root / f"{credit}-crash", *common, "--resume")
    full, resumed = _weights(root / f"{credit}-full"), _weights(root / f"{credit}-crash")
    diff = max((full[k] - resumed[k]).abs().max().item() for k in full)
    assert diff == 0.0, f"{credit}: resumed weights differ by up to {diff:.3g}"
    rows = {name: read_jsonl(root / name / "metrics.jsonl") for name in (f"{credit}-full", f"{credit}-crash")}
    losses = {name: [(r["step"], r["loss"]) for r in rs] for name, rs in rows.items()}
    assert losses[f"{credit}-full"] == losses[f"{credit}-crash"]
    dumps = {name: read_jsonl(root / name / "attributions.jsonl") for name in rows}
    assert [d["step"] for d in dumps[f"{credit}-crash"]] == [d["step"] for d in dumps[f"{credit}-full"]] != []
    assert [d["weights"] for d in dumps[f"{credit}-crash"]] == [d["weights"] for d in dumps[f"{credit}-full"]]


def test_resume_from_a_checkpoint_at_max_steps_trains_no_further(workspace):
    root, config = workspace
    out = root / "at-max"
    _train(config, out, "--credit", "grpo", "--max_steps", "2")
    (out / "model.safetensors").unlink()  # as if killed during the final save
    for _ in range(2):
        summary = _train(config, out, "--credit", "grpo", "--max_steps", "2", "--resume")
        assert summary["steps"] == 2
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    from safetensors.torch import load_file

    final, ckpt = _weights(out), load_file(str(out / "checkpoint-2" / "model.safetensors"))
    assert all(torch.equal(final[k], ckpt[k]) for k in ckpt)


# --- damaged checkpoints, rotation, symlinks, run.json (issues 31 and 35) ---------------------------------------


@pytest.fixture(scope="module")
def checkpointed(workspace):
    """A finished OAR-G run of 4 steps with checkpoint-2 and checkpoint-4 (copied per test before damage)."""
    root, config = workspace
    out = root / "checkpointed"
    _train(config, out, "--credit", "oar-g", "--max_steps", "4")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    return out


def _copy_run(src, dst):
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _damage(ckpt, how):
    """Damage one file of the checkpoint directory ``ckpt`` as ``how`` says; returns the file's name."""
    name, _, kind = how.partition(":")
    path = ckpt / name
    if kind == "truncated":
        _truncate(path)
    elif kind == "garbage":
        path.write_bytes(b"\x00not a checkpoint file\xff" * 7)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "missing":
        path.unlink()
    elif kind == "wrong":  # a valid torch file of the wrong content
        torch.save({"generator": "no", "rollouts": 1.5}, path)
    elif kind == "step":  # trainer_state.json of another step
        state = json.loads(path.read_text())
        path.write_text(json.dumps({**state, "global_step": state["global_step"] - 1}))
    return name


DAMAGE = ["model.safetensors:truncated", "model.safetensors:empty", "optimizer.pt:truncated", "optimizer.pt:garbage",
          "optimizer.pt:missing", "scheduler.pt:missing", "scheduler.pt:garbage", "rng_state.pth:truncated",
          "rng_state.pth:missing", "oar_state_0.pth:garbage", "oar_state_0.pth:wrong", "trainer_state.json:step",
          "trainer_state.json:truncated", "model.safetensors:missing"]


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_checkpoint_is_named_and_the_previous_one_resumed(tmp_path, capsys, checkpointed, how):
    from oar.checkpoints import resume_checkpoint

    out = _copy_run(checkpointed, tmp_path / "run")
    name = _damage(out / "checkpoint-4", how)
    assert resume_checkpoint(out).endswith("checkpoint-2")
    err = capsys.readouterr().err
    assert "checkpoint-4" in err and name in err and "resuming from checkpoint-2" in err, err
    assert err.count("\n") == 1, err  # one line


@pytest.mark.parametrize("how", DAMAGE[::3])
def test_no_intact_checkpoint_is_one_line_naming_each(tmp_path, capsys, workspace, checkpointed, how):
    _, config = workspace
    out = _copy_run(checkpointed, tmp_path / "run")
    name = _damage(out / "checkpoint-4", how)
    _damage(out / "checkpoint-2", "optimizer.pt:truncated")
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert main(["train", "--config", str(config), "--output_dir", str(out), "--credit", "oar-g", "--max_steps", "4",
                 "--resume"]) == 2
    err = _one_error_line(capsys.readouterr().err)
    assert "checkpoint-4" in err and name in err and "checkpoint-2" in err and "optimizer.pt" in err, err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before  # nothing touched


def test_resume_past_a_damaged_checkpoint_is_the_uninterrupted_run(tmp_path, capsys, workspace, checkpointed):
    """checkpoint-4's optimizer state is broken and the final save never happened: --resume retrains steps 3-4
    from checkpoint-2 and ends with the uninterrupted run's weights, metrics 1..4 once each."""
    root, config = workspace
    out = _copy_run(checkpointed, tmp_path / "run")
    (out / "model.safetensors").unlink()
    _damage(out / "checkpoint-4", "optimizer.pt:truncated")
    assert main(["train", "--config", str(config), "--output_dir", str(out), "--credit", "oar-g", "--max_steps", "4",
                 "--resume"]) == 0
    err = capsys.readouterr().err
    assert "checkpoint-4" in err and "optimizer.pt" in err and "resuming from checkpoint-2" in err
    full, resumed = _weights(checkpointed), _weights(out)
    assert max((full[k] - resumed[k]).abs().max().item() for k in full) == 0.0
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert json.loads((out / "run.json").read_text())["resumed_from_step"] == 2
    from oar.checkpoints import resume_checkpoint

    assert resume_checkpoint(out).endswith("checkpoint-4")  # the damaged one was replaced by a whole one


def test_resume_does_not_follow_a_checkpoint_symlink_into_another_run(tmp_path, capsys, checkpointed):
    from oar.checkpoints import checkpoint_dirs, last_checkpoint, resume_checkpoint, rotate

    other = _copy_run(checkpointed, tmp_path / "other")
    (other / "checkpoint-4").rename(other / "checkpoint-6")
    state = json.loads((other / "checkpoint-6" / "trainer_state.json").read_text())
    (other / "checkpoint-6" / "trainer_state.json").write_text(json.dumps({**state, "global_step": 6}))
    out = _copy_run(checkpointed, tmp_path / "run")
    (out / "checkpoint-6").symlink_to(other / "checkpoint-6", target_is_directory=True)
    assert last_checkpoint(out).endswith("checkpoint-4") and resume_checkpoint(out).endswith("checkpoint-4")
    err = capsys.readouterr().err
    assert "checkpoint-6 is a symbolic link" in err and str(other / "checkpoint-6") in err
    assert [n for n, _ in checkpoint_dirs(out)] == [2, 4]
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(save_total_limit=1),
                                    state=types.SimpleNamespace(best_model_checkpoint=None))
    rotate(trainer, str(out))  # never deletes through the link
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    assert (other / "checkpoint-6" / "model.safetensors").is_file()


def test_a_checkpoint_whose_name_is_not_its_step_is_passed_over(tmp_path, capsys, checkpointed):
    from oar.checkpoints import last_checkpoint, resume_checkpoint

    out = _copy_run(checkpointed, tmp_path / "run")
    (out / "checkpoint-2").rename(out / "checkpoint-8")  # holds step 2
    assert last_checkpoint(out).endswith("checkpoint-4") and resume_checkpoint(out).endswith("checkpoint-4")
    err = capsys.readouterr().err
    assert "checkpoint-8" in err and "step 2, not 8" in err, err


@pytest.mark.parametrize("run_json", ["missing", "no config", "a list"])
def test_checkpoints_without_run_json_do_not_resume(tmp_path, capsys, workspace, checkpointed, run_json):
    root, config = workspace
    out = _copy_run(checkpointed, tmp_path / "run")
    if run_json == "missing":
        (out / "run.json").unlink()
    else:
        (out / "run.json").write_text(json.dumps({"credit": "oar-g"} if run_json == "no config" else [1]))
    assert main(["train", "--config", str(config), "--output_dir", str(out), "--credit", "oar-g", "--max_steps", "6",
                 "--resume"]) == 2
    err = _one_error_line(capsys.readouterr().err)
    assert str(out / "run.json") in err and "cannot be checked" in err, err


def test_rotation_killed_mid_delete_never_leaves_half_a_checkpoint(tmp_path, monkeypatch, checkpointed):
    """A kill while rotation deletes checkpoint-2: what is left is a whole checkpoint-2 or none (its remains
    are in .trash-checkpoint-2, which resume clears), never a checkpoint-2 with files missing."""
    import shutil

    from oar import checkpoints
    from oar.checkpoints import resume_checkpoint, rotate

    out = _copy_run(checkpointed, tmp_path / "run")
    real = shutil.rmtree

    def killed_rmtree(path, *args, **kwargs):
        files = sorted(p for p in Path(path).iterdir() if p.is_file())
        files[0].unlink()  # the first file is gone, then the kill
        raise KeyboardInterrupt("killed mid-delete")

    monkeypatch.setattr(checkpoints.shutil, "rmtree",
                        lambda p, *a, **k: killed_rmtree(p) if "checkpoint-2" in str(p) and Path(p).exists()
                        else real(p, *a, **k))
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(save_total_limit=1),
                                    state=types.SimpleNamespace(best_model_checkpoint=None))
    with pytest.raises(KeyboardInterrupt):
        rotate(trainer, str(out))
    monkeypatch.setattr(checkpoints.shutil, "rmtree", real)
    assert not (out / "checkpoint-2").exists() and (out / ".trash-checkpoint-2").is_dir()
    (out / "checkpoint-4").rename(out / "moved-away")  # even with no newer checkpoint, the remains are not resumed
    assert resume_checkpoint(out) is None and not (out / ".trash-checkpoint-2").exists()


@pytest.mark.parametrize("change, field", [(["--learning_rate", "0.002"], "learning_rate"),
                                           (["--credit", "oar-g"], "credit"),
                                           (["--prompt_column", "gold"], "prompt_column")])
def test_resume_refuses_changed_settings_naming_the_field(workspace, capsys, change, field):
    root, config = workspace
    out = root / "settled"
    if not (out / "run.json").is_file():
        _train(config, out, "--credit", "grpo", "--max_steps", "2")
    before = (out / "run.json").read_text()
    argv = ["train", "--config", str(config), "--output_dir", str(out), "--credit", "grpo", "--max_steps", "3"]
    assert main([*argv, *change, "--resume"]) == 2
    err = _one_error_line(capsys.readouterr().err)
    assert field in err, err
    assert (out / "run.json").read_text() == before  # nothing rewritten


def test_non_finite_rewards_are_counted_and_warned(workspace, caplog):
    root, config = workspace

    def broken_reward(prompts, completions, **kwargs):
        return [math.inf if i % 2 else math.nan for i in range(len(completions))]

    script, cfg = parse_train_args(["--config", str(config), "--output_dir", str(root / "inf"), "--credit", "grpo",
                                    "--max_steps", "1"])
    with caplog.at_level(logging.WARNING, logger="oar.trainer"):
        run_training(script, cfg, reward_funcs=[broken_reward])
    rows = read_jsonl(root / "inf" / "metrics.jsonl")
    assert rows[0]["oar/nonfinite_rewards"] == 8.0
    assert any("8 of 8 completions" in r.getMessage() and "trains on nothing" in r.getMessage()
               for r in caplog.records)


# --- bad input: one line naming it ----------------------------------------------------------------------------


def _bad_inputs(root, config):
    """(name, argv extra, text the one error line must contain); files they need are written here."""
    cases = []

    def data(name, text):
        path = root / "bad-data" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        return str(path)

    good = json.dumps({"question": "1+1=", "gold": "2"}) + "\n"
    cases.append(("malformed jsonl line", ["--dataset", data("torn.jsonl", good * 2 + '{"question": "2+2=", \n')],
                  "torn.jsonl:3"))
    cases.append(("empty jsonl", ["--dataset", data("empty.jsonl", "")], "empty.jsonl"))
    for name, row, column in [("null prompt", {"question": None, "gold": "2"}, "question"),
                              ("list prompt", {"question": ["1+1="], "gold": "2"}, "question"),
                              ("empty prompt", {"question": " ", "gold": "2"}, "question"),
                              ("null answer", {"question": "1+1=", "gold": None}, "gold")]:
        path = data(name.replace(" ", "_") + ".jsonl", good + json.dumps(row) + "\n")
        cases.append((name, ["--dataset", path], f"row 2: column '{column}'"))
    yaml_dir = root / "bad-yaml"
    yaml_dir.mkdir(exist_ok=True)
    base = config.read_text()
    for name, extra_yaml, needle in [("yaml syntax", "learning_rate: [0.1\n", "bad_yaml_syntax.yaml:"),
                                     ("float max_steps", "max_steps: 2.5\n", "max_steps"),
                                     ("list for a float", "adam_beta1: [0.9, 0.8]\n", "adam_beta1"),
                                     ("text for an int", "num_generations: four\n", "num_generations")]:
        path = yaml_dir / f"bad_{name.replace(' ', '_')}.yaml"
        path.write_text(base + extra_yaml)
        cases.append((name, ["--config", str(path)], needle))
    cases.append(("negative max_steps", ["--max_steps", "-5"], "max_steps"))
    cases.append(("negative save_steps", ["--save_steps", "-2"], "save_steps"))
    model_dir = root / "tiny"
    no_tok = root / "no-tokenizer"
    no_tok.mkdir(exist_ok=True)
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        if (model_dir / f).is_file():
            (no_tok / f).write_bytes((model_dir / f).read_bytes())
    cases.append(("model without tokenizer", ["--model", str(no_tok)], "tokenizer"))
    torn = root / "torn-weights"
    torn.mkdir(exist_ok=True)
    for f in model_dir.iterdir():
        (torn / f.name).write_bytes(f.read_bytes()[: 1000] if f.name == "model.safetensors" else f.read_bytes())
    cases.append(("truncated weights", ["--model", str(torn)], "model.safetensors"))
    blocker = root / "blocker"
    blocker.write_text("a file")
    cases.append(("output dir is a file", ["--output_dir", str(blocker)], str(blocker)))
    cases.append(("output dir under a file", ["--output_dir", str(blocker / "run")], str(blocker / "run")))
    return cases


_CASES = ["malformed jsonl line", "empty jsonl", "null prompt", "list prompt", "empty prompt", "null answer",
          "yaml syntax", "float max_steps", "list for a float", "text for an int", "negative max_steps",
          "negative save_steps", "model without tokenizer", "truncated weights", "output dir is a file",
          "output dir under a file"]


@pytest.mark.parametrize("case", _CASES)
def test_bad_input_is_one_line_naming_it(workspace, capsys, case):
    root, config = workspace
    cases = {name: (extra, needle) for name, extra, needle in _bad_inputs(root, config)}
    assert set(cases) == set(_CASES)
    extra, needle = cases[case]
    argv = ["train", "--config", str(config), "--output_dir", str(root / f"out-{case.replace(' ', '_')}"),
            "--max_steps", "1"]
    if "--config" in extra:
        argv[1:3] = []
    assert main([*argv, *extra]) == 2
    err = _one_error_line(capsys.readouterr().err)
    assert needle in err, err


def test_unwritable_output_dir_is_one_line(workspace, capsys, monkeypatch):
    """A read-only run directory on --resume (simulated: this suite may run as root, which ignores modes)."""
    import tempfile

    root, config = workspace

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    assert main(["train", "--config", str(config), "--output_dir", str(root / "ro"), "--resume"]) == 2
    err = _one_error_line(capsys.readouterr().err)
    assert "not writable (Permission denied)" in err and str(root / "ro") in err


def test_yaml_type_check_accepts_what_argparse_converts(tmp_path):
    from oar.config_file import check_config_file
    from oar.train_run import TrainArguments
    from oar.trainer import OARConfig

    path = tmp_path / "ok.yaml"
    path.write_text("learning_rate: 1e-3\nmax_steps: '7'\nbf16: true\nreport_to: none\nprobe_mode: null\n"
                    "credit_options: {rho: 0.2}\nenv: {A: 1}\n")
    assert check_config_file(str(path), (TrainArguments, OARConfig))["learning_rate"] == "1e-3"
    path.write_text("max_steps: '2.5'\n")
    with pytest.raises(ValueError, match="max_steps: '2.5' is not a valid int"):
        check_config_file(str(path), (TrainArguments, OARConfig))


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_save_then_resume(tmp_path):
    """One real trial of checks/faults.py: ``oar train`` (OAR-G) SIGKILLed while a checkpoint is being
    written, then ``--resume``: complete checkpoints only, metrics exactly steps 1..N, bit-identical weights."""
    import random
    import subprocess

    from checks import faults

    config = faults.workspace(tmp_path)
    subprocess.run(faults._cmd(config, tmp_path / "ref", "oar-g", False), env=faults._env(), check=True,
                   capture_output=True)
    row = faults.trial(config, tmp_path, "oar-g", "save", faults._weights(tmp_path / "ref"), random.Random(0))
    assert row["happened"] == "save" and row["resume_rc"] == 0, row
    assert row["checkpoints_complete"] and row["metrics_exact"] and row["bit_identical"], row
