"""No non-finite number reaches a run (issue 31): every float field of the training config, the comparison's
budget and the lab's run settings are refused in one ``oar …: error:`` line naming the field and the value, before
any work (the model, the data, the warm start). The credit options' cases are at the end, marked: their
declarations belong to oar.credit."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import pytest

from oar.cli import main
from oar.ranges import check_finite_fields

pytest.importorskip("trl")

from oar.trainer import OARConfig  # noqa: E402

NON_FINITE = ("nan", "inf", "-inf")


def _one_error_line(stderr: str, prog: str) -> str:
    lines = stderr.strip().splitlines()
    assert lines and lines[-1].startswith(f"{prog}: error:"), stderr[-2000:]
    assert "Traceback" not in stderr and sum("error:" in line for line in lines) == 1, stderr[-2000:]
    return lines[-1]


def _float_fields() -> list[tuple[str, bool]]:
    """(name, holds a list) of every OARConfig field annotated with float, whoever declared it (TRL,
    transformers, oar): a field added by a later TRL is covered without editing this test."""
    out = []
    for f in dataclasses.fields(OARConfig):
        kind = str(f.type)
        if "float" in kind and "dict" not in kind:
            out.append((f.name, kind.startswith("list")))
    return out


FLOAT_FIELDS = _float_fields()


def test_the_config_has_the_float_fields_the_campaign_named():
    names = {n for n, _ in FLOAT_FIELDS}
    assert {"learning_rate", "max_grad_norm", "temperature", "oar_tau", "noise_std", "reward_weights"} <= names
    assert len(names) > 30  # TRL's and transformers' own, not a hand list


@pytest.mark.parametrize("i, name, is_list", [(i, n, lst) for i, (n, lst) in enumerate(FLOAT_FIELDS)],
                         ids=[n for n, _ in FLOAT_FIELDS])
def test_every_non_finite_float_field_of_oar_train_is_one_line(tmp_path, capsys, i, name, is_list):
    value = NON_FINITE[i % 3]
    arg = [f"--{name}", "1.0", value] if is_list else [f"--{name}={value}"]
    out = tmp_path / "run"
    assert main(["train", "--model", "m", "--dataset", "d.jsonl", "--output_dir", str(out), *arg]) == 2
    err = _one_error_line(capsys.readouterr().err, "oar train")
    assert name in err and value.lstrip("-") in err and "finite" in err, err
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("yaml_line, name", [("learning_rate: .inf", "learning_rate"),
                                             ("adam_epsilon: .nan", "adam_epsilon"),
                                             ("logging_steps: .inf", "logging_steps"),
                                             ("reward_weights: [1.0, -.inf]", "reward_weights")])
def test_non_finite_yaml_values_are_one_line(tmp_path, capsys, yaml_line, name):
    config = tmp_path / "c.yaml"
    config.write_text(f"model: m\ndataset: d.jsonl\noutput_dir: {tmp_path / 'run'}\n{yaml_line}\n")
    assert main(["train", "--config", str(config)]) == 2
    err = _one_error_line(capsys.readouterr().err, "oar train")
    assert f"{name} must be" in err and "finite" in err, err


def test_python_api_refuses_non_finite_fields_before_transformers_checks(tmp_path):
    # transformers' own check of logging_steps would raise OverflowError (int(inf)); the field is named first
    with pytest.raises(ValueError, match="logging_steps must be a finite number, got inf"):
        OARConfig(output_dir=str(tmp_path), logging_steps=math.inf, use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="warmup_steps must be a finite number, got nan"):
        OARConfig(output_dir=str(tmp_path), warmup_steps=math.nan, use_cpu=True, bf16=False)
    cfg = OARConfig(output_dir=str(tmp_path), learning_rate=1e300, use_cpu=True, bf16=False)  # finite: accepted
    assert cfg.learning_rate == 1e300


def test_check_finite_fields_reaches_nested_dataclasses_and_lists():
    @dataclass
    class Inner:
        lr: float = 1.0
        betas: tuple = (0.9, 0.99)

    @dataclass
    class Outer:
        name: str = "x"
        steps: int = 3
        inner: Inner = field(default_factory=Inner)
        extra: dict = field(default_factory=dict)

    check_finite_fields(Outer(extra={"a": math.nan}))  # dicts are checked where their keys are declared
    with pytest.raises(ValueError, match=r"^inner\.lr must be a finite number, got -inf$"):
        check_finite_fields(Outer(inner=Inner(lr=-math.inf)))
    with pytest.raises(ValueError, match=r"^inner\.betas must be finite numbers, got \(0\.9, nan\)$"):
        check_finite_fields(Outer(inner=Inner(betas=(0.9, math.nan))))


# --- oar compare: no numeric input makes a run unbounded, and none crashes it -----------------------------------


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if a comparison gets as far as its warm start."""
    from oar.lab import compare as lab_compare

    def reached(*args, **kwargs):
        raise AssertionError("the warm start was reached: the bad value was not refused first")

    monkeypatch.setattr(lab_compare, "warm_start", reached)


@pytest.mark.parametrize("args, needle", [
    (["--budget", "nan"], "budget_s"), (["--budget", "inf"], "budget_s"), (["--budget=-inf"], "budget_s"),
    (["--budget", "1e999"], "budget_s"), (["--budget=-30"], "budget_s"), (["--budget", "0"], "budget_s"),
    (["--seeds", "100000000"], "seeds"), (["--seeds", "0"], "seeds"), (["--seeds=-2"], "seeds"),
    (["--max-steps", "0"], "max_steps"), (["--max-steps=-1"], "max_steps"), (["--workers", "0"], "workers"),
    (["--verbosity=-1"], "verbosity"), (["--budget", "NaN", "--max-steps", "5"], "budget_s"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_compare_numbers_are_refused_before_any_work(tmp_path, capsys, no_work, args, needle):
    out = tmp_path / "cmp"
    assert main(["compare", "--quick", "--credits", "grpo", "--out", str(out), *args]) == 2
    err = _one_error_line(capsys.readouterr().err, "oar compare")
    assert needle in err, err
    assert not out.exists()


def test_lab_run_config_refuses_non_finite_fields():
    from oar.lab.run import RunConfig
    from oar.lab.warmstart import WarmStartConfig

    with pytest.raises(ValueError, match="budget_s must be a finite number, got nan"):
        RunConfig(budget_s=math.nan)
    with pytest.raises(ValueError, match="lr must be a finite number, got inf"):
        RunConfig(lr=math.inf)
    with pytest.raises(ValueError, match=r"warm\.lr must be a finite number, got nan"):
        RunConfig(warm=WarmStartConfig(lr=math.nan))


# --- credit options: finiteness declared with every option (oar.credit), checked at every entry point ------------


@pytest.mark.parametrize("column, option", [
    ("gtpo@alpha1=NaN", "alpha1"),
    ("gtpo@alpha2=-Infinity", "alpha2"),
    ("ktae@alpha=Infinity", "alpha"),
    ("entropy-mask@temperature=NaN", "temperature"),
    ("oar-g@tau=NaN", "tau"),
    ("oar-g@beta=Infinity", "beta"),
])
def test_compare_refuses_non_finite_credit_options(tmp_path, capsys, no_work, column, option):
    assert main(["compare", "--quick", "--credits", column, "--out", str(tmp_path / "cmp")]) == 2
    err = _one_error_line(capsys.readouterr().err, "oar compare")
    assert option in err, err


@pytest.mark.parametrize("credit, options, option", [
    ("gtpo", '{"alpha2": -Infinity}', "alpha2"),
    ("gtpo", '{"alpha1": NaN}', "alpha1"),
    ("ktae", '{"beta": Infinity}', "beta"),
    ("oar-g", '{"floor": NaN}', "floor"),
])
def test_train_refuses_non_finite_credit_options(tmp_path, capsys, credit, options, option):
    argv = ["train", "--model", "m", "--dataset", str(tmp_path / "missing.jsonl"), "--output_dir",
            str(tmp_path / "run"), "--credit", credit, "--credit_options", options]
    assert main(argv) == 2
    err = _one_error_line(capsys.readouterr().err, "oar train")
    assert option in err and "missing.jsonl" not in err, err
