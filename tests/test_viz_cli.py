"""``oar attribute`` and ``oar report`` end to end (parsing, wiring, user errors)."""

from __future__ import annotations

import json

import pytest

from oar.attribution import append_records, read_records
from oar.cli import main
from oar.viz.records import select_records
from test_viz import make_record
from test_viz_report import make_run


@pytest.fixture
def dump(tmp_path):
    """A trainer-style dump: two steps, two credits of the same completion at step 5."""
    path = tmp_path / "attributions.jsonl"
    append_records(path, [make_record("oar-g", step=5), make_record("entropy", step=5)])
    append_records(path, [make_record("oar-g", step=9, prompt="later")])
    return path


def test_select_records(dump):
    recs = read_records(dump)
    assert [r.step for r in select_records(recs, step="last")] == [9]
    assert [r.credit for r in select_records(recs, credits=["entropy"])] == ["entropy"]
    assert len(select_records(recs, limit=1)) == 2  # one completion, both its credits
    with pytest.raises(ValueError, match=r"credit \['oar-p'\] not in the records \(they have: oar-g, entropy\)"):
        select_records(recs, credits=["oar-p"])
    with pytest.raises(ValueError, match="no record at step 7"):
        select_records(recs, step=7)


def test_attribute_from_dump_to_html(dump, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert main(["attribute", "--from-jsonl", str(dump), "--out", str(out), "--step", "5"]) == 0
    page = out.read_text()
    assert page.count('class="example"') == 1 and page.count('class="tokens"') == 2
    assert page.count('class="tok ') == 2 * len(make_record().tokens)
    assert "wrote" in capsys.readouterr().out


def test_attribute_from_dump_to_terminal(dump, capsys):
    assert main(["attribute", "--from-jsonl", str(dump), "--credit", "oar-g", "--step", "last"]) == 0
    out = capsys.readouterr().out
    assert "later" in out and "\\boxed{2}" in out and "entropy" not in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--from-jsonl", "missing.jsonl"], "no such file: missing.jsonl"),
        (["--prompt", "1+1?", "--completion", "2 \\boxed{2}"], "a model is needed"),
        (["--prompt", "1+1?"], "prompt given without a completion"),
        ([], "give --prompt and --completion, or --from-jsonl FILE"),
        # a credit's options are checked before the model loads (the model does not exist)
        (["--model", "/no/such/model", "--prompt", "1?", "--completion", "1",
          "--credit", "oar-g@noise_std=0&mode=last"], "noise_std must be > 0 unless mode is 'answer_joint'"),
        (["--model", "/no/such/model", "--prompt", "1?", "--completion", "1", "--credit", "gtpo@alpha2=-Infinity"],
         "alpha2 must be a finite number, got -inf"),
    ],
)
def test_attribute_user_errors(argv, message, capsys):
    assert main(["attribute", *argv]) == 2
    assert message in capsys.readouterr().err


def test_attribute_computes_with_a_model(tmp_path, char_tokenizer, tiny_qwen2):
    model_dir = tmp_path / "model"
    tiny_qwen2.save_pretrained(model_dir)
    char_tokenizer.save_pretrained(model_dir)
    pairs = tmp_path / "pairs.jsonl"
    # no whitespace: a char tokenizer saved next to a qwen2 config reloads without its space/newline tokens
    rows = [{"prompt": "(2+3)*4?", "completion": "2+3=5;5*4=20;\\boxed{20}"},
            {"prompt": "7-1?", "completion": "7-1=6;answer:6"}]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "page.html"
    argv = ["attribute", "--model", str(model_dir), "--from-jsonl", str(pairs), "--credit", "oar-g",
            "--credit", "entropy", "--out", str(out)]
    assert main(argv) == 0
    page = out.read_text()
    assert page.count('class="example"') == 2 and page.count('data-credit="entropy"') == 2
    assert page.count('class="tok ') == 2 * sum(len(r["completion"]) for r in rows)
    assert "Spearman" in page
    argv = ["attribute", "--model", str(model_dir), "--from-jsonl", str(pairs), "--credit", "oar-g@tau=0.5",
            "--out", str(out)]  # a credit with options: its records carry it whole
    assert main(argv) == 0 and out.read_text().count('data-credit="oar-g@tau=0.5"') == 2
    assert main(["attribute", "--model", str(model_dir), "--prompt", "1?", "--completion", "1 \\boxed{1}",
                 "--credit", "bogus"]) == 2


def test_attribute_imports_a_user_credit(tmp_path, char_tokenizer, tiny_qwen2, user_credit_module, capsys):
    model_dir = tmp_path / "model"
    tiny_qwen2.save_pretrained(model_dir)
    char_tokenizer.save_pretrained(model_dir)
    out = tmp_path / "page.html"
    argv = ["attribute", "--model", str(model_dir), "--prompt", "1?", "--completion", "1;\\boxed{1}",
            "--credit", "user-first", "--out", str(out)]
    assert main(argv) == 2 and "unknown credit 'user-first'" in capsys.readouterr().err
    assert main([*argv, "--import", user_credit_module]) == 0
    assert out.read_text().count('data-credit="user-first"') == 1
    assert main([*argv, "--import", "no_such_module_x"]) == 2
    assert "no_such_module_x" in capsys.readouterr().err


def test_report_cli(tmp_path, capsys):
    for seed in (0, 1):
        make_run(tmp_path / "cmp", f"grpo-{seed}", "grpo", seed, 0.6)
    results = tmp_path / "res.json"
    results.write_text(json.dumps({"grpo": {"accuracy": 0.6}}))
    assert main(["report", str(tmp_path / "cmp"), "--results", str(results), "--x", "wall_time"]) == 0
    md = (tmp_path / "cmp" / "report" / "report.md").read_text()
    assert "| grpo | 0.6 |" in md and "curves against wall_time" in md
    assert main(["report", str(tmp_path / "cmp" / "grpo-0"), str(tmp_path / "cmp" / "grpo-1")]) == 0
    assert (tmp_path / "cmp" / "report" / "report.md").is_file()
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "run directory not found" in capsys.readouterr().err
