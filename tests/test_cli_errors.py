"""A wrong-type, wrong-choice or missing argument is one ``oar …: error:`` line naming the value, exit status 2
(argparse used to print its usage block first: for ``oar train`` TRL's, about 200 lines); ``--help`` works."""

from __future__ import annotations

import pytest

from oar.cli import main


@pytest.mark.parametrize(
    "argv, prog, needle",
    [
        (["eval", "--model", "m", "--samples", "2.5"], "oar eval", "--samples: invalid int value: '2.5'"),
        (["eval", "--model", "m", "--temperature", "hot"], "oar eval", "--temperature: invalid float value: 'hot'"),
        (["eval", "--model", "m", "--backend", "foo"], "oar eval", "--backend: invalid choice: 'foo'"),
        (["eval", "--samples", "2"], "oar eval", "required: --model"),
        (["compare", "--workers", "two"], "oar compare", "--workers: invalid int value: 'two'"),
        (["compare", "--budget", "soon"], "oar compare", "--budget: invalid float value: 'soon'"),
        (["compare", "--quick", "--study"], "oar compare", "not allowed with argument --quick"),
        (["report", "runs", "--x", "epoch"], "oar report", "--x: invalid choice: 'epoch'"),
        (["attribute", "--limit", "1.5"], "oar attribute", "--limit: invalid int value: '1.5'"),
        (["attribute", "--step", "first"], "oar attribute", "got 'first'"),
        (["credits", "--colour"], "oar", "unrecognized arguments: --colour"),
        (["train", "--max_steps", "2.5"], "oar train", "invalid int value: '2.5'"),
        (["train", "--learning_rate", "fast"], "oar train", "invalid float value: 'fast'"),
        (["train", "--lr_scheduler_type", "bogus"], "oar train", "invalid choice: 'bogus'"),
        (["bogus"], "oar", "invalid choice: 'bogus'"),
        ([], "oar", "required: COMMAND"),
    ],
)
def test_argument_errors_are_one_line_naming_the_value(argv, prog, needle, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error: ") and needle in lines[0], lines[0]
    assert lines[0].endswith(f"(see {prog} --help)")
    assert out == ""


@pytest.mark.parametrize("argv, needle", [(["--help"], "usage: oar"), (["eval", "--help"], "--samples SAMPLES"),
                                          (["train", "--help"], "--max_steps")])
def test_help_still_prints_the_usage(argv, needle, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    assert needle in capsys.readouterr().out


def test_parsers_outside_oar_train_are_left_alone(capsys):
    """TRL's parser is switched to one-line errors only while ``oar train`` parses."""
    import argparse

    parser = argparse.ArgumentParser(prog="other")
    parser.add_argument("--n", type=int)
    with pytest.raises(SystemExit):
        main(["train", "--max_steps", "x"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        parser.parse_args(["--n", "x"])
    assert capsys.readouterr().err.startswith("usage: other")
