"""``oar train`` end to end on a tiny local model and a JSONL task: run directory, resume, user errors."""

from __future__ import annotations

import json
import os
import types

import pytest

from trainer_setup import task_rows, warm_tiny_lm

pytest.importorskip("trl")

from oar.attribution import read_records  # noqa: E402
from oar.checkpoints import FINAL_STAGING, last_checkpoint, save_final_model  # noqa: E402
from oar.cli import main  # noqa: E402
from oar.files import read_jsonl  # noqa: E402
from oar.train_data import load_train_dataset  # noqa: E402


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, char_tokenizer):
    """A saved tiny model directory and a JSONL dataset with non-default column names."""
    root = tmp_path_factory.mktemp("train_cli")
    model_dir = root / "tiny"
    warm_tiny_lm(char_tokenizer).save_pretrained(model_dir)
    char_tokenizer.save_pretrained(model_dir)
    data = root / "add.jsonl"
    data.write_text("".join(json.dumps({"question": r["prompt"], "gold": r["answer"], "id": i}) + "\n"
                            for i, r in enumerate(task_rows(24, seed=11))))
    config = root / "train.yaml"
    config.write_text(
        f"model: {model_dir}\ndataset: {data}\nprompt_column: question\nanswer_column: gold\n"
        "prompt_template: '{question}'\nper_device_train_batch_size: 8\nnum_generations: 4\n"
        "max_completion_length: 24\nlearning_rate: 0.001\nlogging_steps: 1\nsave_steps: 1\nreport_to: none\n"
        "seed: 0\ncredit: grpo\noar_dump_every: 1\noar_dump_count: 2\n"
    )
    return root, config


def test_train_writes_the_run_dir_and_resumes(workspace, capsys):
    root, config = workspace
    out = root / "run"
    argv = ["train", "--config", str(config), "--output_dir", str(out), "--credit", "oar-g", "--max_steps", "2"]
    assert main(argv) == 0
    printed, done = capsys.readouterr().out.split("oar train: done\n", 1)
    summary = json.loads(done)
    assert summary["steps"] == 2 and summary["credit"] == "oar-g"
    assert "'loss'" not in printed, "the live line, not transformers' printed log dicts"

    run = json.loads((out / "run.json").read_text())
    assert run["credit"] == "oar-g" and run["seed"] == 0 and run["model"].endswith("tiny")
    assert run["config"]["max_completion_length"] == 24 and "train_runtime" in run["summary"]
    records = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for key in ("wall_time", "reward", "loss", "grad_norm", "entropy", "step_time", "oar/ess_ratio",
                "oar/weight_std", "oar/frac_uniform", "oar/importance_time", "oar/importance_share"):
        assert key in records[0], key
    assert records[0]["wall_time"] < records[1]["wall_time"]
    assert last_checkpoint(out).endswith("checkpoint-2")
    dumps = read_records(out / "attributions.jsonl")
    assert dumps and all(d.credit == "oar-g" and len(d.tokens) == len(d.weights) for d in dumps)
    assert all(d.reward in (0.0, 1.0) for d in dumps), "TRL's reward of the completion"
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert not (out / FINAL_STAGING).exists()

    # a half-written newest checkpoint is ignored; --resume continues from checkpoint-2 to step 3
    (out / "checkpoint-9").mkdir()
    (out / "checkpoint-9" / "trainer_state.json").write_text('{"global_st')
    assert last_checkpoint(out).endswith("checkpoint-2")
    assert main(["train", "--config", str(config), "--output_dir", str(out), "--credit", "oar-g",
                 "--max_steps", "3", "--resume"]) == 0
    records = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[1]["wall_time"] <= records[2]["wall_time"]
    assert json.loads((out / "run.json").read_text())["resumed_from_step"] == 2


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--answer_column", "solution"], "solution"),
        (["--dataset", "/nonexistent/data.jsonl"], "/nonexistent/data.jsonl"),
        (["--credit", "oar-x"], "credit"),
        (["--conversational", "maybe"], "conversational"),
    ],
)
def test_user_errors_name_the_bad_value(workspace, capsys, extra, message):
    root, config = workspace
    code = main(["train", "--config", str(config), "--output_dir", str(root / "bad"), "--max_steps", "1", *extra])
    assert code == 2
    assert message in capsys.readouterr().err


def test_refuses_to_overwrite_a_run_without_resume(workspace, capsys):
    root, config = workspace
    out = root / "taken"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["train", "--config", str(config), "--output_dir", str(out), "--max_steps", "1"]) == 2
    assert "--resume" in capsys.readouterr().err


def test_dataset_loader_formats(tmp_path):
    rows = [{"problem": "1+1=", "solution": "so \\boxed{2}", "answer": "#### 2"}]
    (tmp_path / "d.jsonl").write_text(json.dumps(rows[0]) + "\n")
    pd = pytest.importorskip("pandas")
    pd.DataFrame(rows).to_parquet(tmp_path / "d.parquet")
    a = load_train_dataset(str(tmp_path / "d.jsonl"), answer_column="solution", prompt_template="Q: {question}")
    b = load_train_dataset(str(tmp_path / "d.parquet"), conversational=True)
    assert a[0] == {"prompt": "Q: 1+1=", "answer": "2"}
    from oar.prompts import PROMPT_TEMPLATE  # the default: the prompts oar train and oar eval use

    assert b[0] == {"prompt": [{"role": "user", "content": PROMPT_TEMPLATE.replace("{question}", "1+1=")}],
                    "answer": "2"}
    with pytest.raises(ValueError, match="'question'"):
        load_train_dataset(str(tmp_path / "d.jsonl"), prompt_column="question")


def test_recipes_parse_with_trl_parser():
    from pathlib import Path

    from oar.train_run import parse_train_args

    recipes = sorted((Path(__file__).parent.parent / "recipes").glob("*.yaml"))
    assert recipes, "no recipe found"
    for recipe in recipes:
        script, config = parse_train_args(["--config", str(recipe), "--bf16", "false", "--use_cpu", "true"])
        assert script.model and script.dataset and config.credit != "grpo", recipe.name
        # the GPU recipes generate with vLLM; the CPU demo (the offline model) samples from its bf16 copy
        assert config.use_vllm == (script.model != "smollm2"), recipe.name


class _FakeTrainer:
    """What ``save_final_model`` uses of a Trainer; ``save_model`` writes ``files`` and may die half-way."""

    def __init__(self, files: dict[str, str], die_after: int | None = None) -> None:
        self.files, self.die_after = files, die_after
        self.args = types.SimpleNamespace(push_to_hub=False)
        self.accelerator = types.SimpleNamespace(wait_for_everyone=lambda: None)

    def is_world_process_zero(self) -> bool:
        return True

    def save_model(self, output_dir: str, _internal_call: bool = False) -> None:
        os.makedirs(output_dir, exist_ok=True)
        for i, (name, text) in enumerate(self.files.items()):
            if i == self.die_after:
                with open(os.path.join(output_dir, name), "w") as f:
                    f.write(text[:3])  # torn write
                raise KeyboardInterrupt("killed mid-save")
            with open(os.path.join(output_dir, name), "w") as f:
                f.write(text)


def test_final_save_is_all_or_previous(tmp_path):
    save_final_model(_FakeTrainer({"config.json": "{old}", "model.safetensors": "old weights"}), tmp_path)
    assert (tmp_path / "model.safetensors").read_text() == "old weights" and not (tmp_path / FINAL_STAGING).exists()
    with pytest.raises(KeyboardInterrupt):
        save_final_model(_FakeTrainer({"config.json": "{new}", "model.safetensors": "new weights"}, die_after=1),
                         tmp_path)
    assert (tmp_path / "model.safetensors").read_text() == "old weights"  # never a torn weight file
    assert (tmp_path / "config.json").read_text() == "{old}"
    save_final_model(_FakeTrainer({"config.json": "{new}", "model.safetensors": "new weights"}), tmp_path)
    assert (tmp_path / "model.safetensors").read_text() == "new weights" and not (tmp_path / FINAL_STAGING).exists()


def test_training_and_evaluation_share_one_prompt_template(tmp_path):
    from oar.eval.generation import DEFAULT_PROMPT
    from oar.prompts import PROMPT_TEMPLATE, fill_template
    from oar.train_run import TrainArguments

    assert TrainArguments().prompt_template == DEFAULT_PROMPT == PROMPT_TEMPLATE
    assert fill_template(PROMPT_TEMPLATE, "1+1?").startswith("1+1?\nPlease reason step by step")
    with pytest.raises(ValueError, match=r"'\{prompt\}' is now '\{question\}'"):
        fill_template("Q: {prompt}", "x")


def test_one_default_column_set_for_cli_library_and_readme(tmp_path):
    """The raw columns have one home (oar.prompts); the CLI, load_train_dataset and the README all use it."""
    import inspect
    from pathlib import Path

    from oar.prompts import ANSWER_COLUMN, QUESTION_COLUMN
    from oar.train_data import read_train_dataset
    from oar.train_run import TrainArguments

    assert TrainArguments().prompt_column == QUESTION_COLUMN and TrainArguments().answer_column == ANSWER_COLUMN
    for fn in (load_train_dataset, read_train_dataset):
        params = inspect.signature(fn).parameters
        assert (params["prompt_column"].default, params["answer_column"].default) == (QUESTION_COLUMN, ANSWER_COLUMN)
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert f'{{"{QUESTION_COLUMN}": ..., "{ANSWER_COLUMN}": ...}}' in readme
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({QUESTION_COLUMN: "1+1?", ANSWER_COLUMN: "2"}) + "\n")
    ds = load_train_dataset(str(path))
    assert sorted(ds.column_names) == ["answer", "prompt"] and ds[0]["prompt"].startswith("1+1?")


def test_import_option_registers_a_user_credit_before_the_config_is_checked(workspace, user_credit_module,
                                                                            capsys):
    from oar.cli.train import split_oar_options

    assert split_oar_options(["--import", "a", "--max_steps", "1", "--verbose", "--import=b"]) == (
        ["--max_steps", "1"], True, ["a", "b"])
    root, config = workspace
    base = ["train", "--config", str(config), "--output_dir", str(root / "user"), "--max_steps", "1",
            "--credit", "user-first", "--dataset", str(root / "missing.jsonl")]
    assert main(base) == 2
    assert "unknown credit 'user-first'" in capsys.readouterr().err
    assert main([*base, "--import", user_credit_module]) == 2  # the credit is known: the next error is the data
    err = capsys.readouterr().err
    assert "missing.jsonl" in err and "credit" not in err
    assert main(["train", "--import", "no_such_module_x", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "no_such_module_x" in err and len(err.strip().splitlines()) == 1


def test_config_warnings_are_dropped_unless_verbose(workspace, capsys):
    """Building OARConfig raises transformers' FutureWarning (gradient_checkpointing renamed); oar train drops it,
    ``--verbose`` keeps it."""
    import warnings

    root, config = workspace
    argv = ["train", "--config", str(config), "--output_dir", str(root / "warn"), "--max_steps", "1",
            "--dataset", str(root / "missing.jsonl")]

    def future_warnings(extra: list[str]) -> list[str]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert main([*argv, *extra]) == 2  # stops at the missing dataset, after the config is built
        capsys.readouterr()
        return [str(w.message) for w in seen if issubclass(w.category, FutureWarning)]

    from oar.trainer import OARConfig

    with warnings.catch_warnings(record=True) as direct:  # what this transformers raises (5.0 raises none)
        warnings.simplefilter("always")
        OARConfig(output_dir=str(root / "direct"), use_cpu=True, bf16=False)
    raised = {str(w.message) for w in direct if issubclass(w.category, FutureWarning)}
    assert raised <= set(future_warnings(["--verbose"]))
    assert future_warnings([]) == []


def test_one_credit_value_reaches_run_json_and_bad_credits_stop_before_any_work(workspace, capsys):
    """``--credit NAME@OPT=V`` is one value from the command line to run.json; a lab-only credit and a refused
    combination of options each get one line naming them, before the model or the data load."""
    root, config = workspace
    base = ["train", "--config", str(config), "--max_steps", "1", "--dataset", str(root / "missing.jsonl")]
    assert main([*base, "--output_dir", str(root / "lab"), "--credit", "oracle-process"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'oracle-process' is lab-only" in err
    assert "oar compare --credits grpo,oracle-process" in err
    assert main([*base, "--output_dir", str(root / "rule"), "--credit", "oar-g@noise_std=0&mode=last"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "noise_std must be > 0 unless mode is 'answer_joint'" in err
    assert not (root / "lab").exists() and not (root / "rule").exists()

    out = root / "spec"
    assert main(["train", "--config", str(config), "--output_dir", str(out), "--max_steps", "1",
                 "--credit", "oar-p@horizon=1&chunk_size=8"]) == 0
    capsys.readouterr()
    run = json.loads((out / "run.json").read_text())
    assert run["credit"] == run["config"]["credit"] == "oar-p@horizon=1&chunk_size=8"
    assert all(d.credit == "oar-p@horizon=1&chunk_size=8" for d in read_records(out / "attributions.jsonl"))


def test_resume_reads_the_credit_of_an_older_run_json(tmp_path):
    """An older oar stored the credit apart (``credit``, ``credit_options``, the option fields, the sampler's
    temperature routed into a credit's own): ``--resume`` compares the credit it trained with, resolved, so the
    same credit written the new way resumes and another one is named."""
    from oar.train_run import check_resume, parse_train_args

    def stored(credit: str, **fields) -> None:
        script, cfg = parse_train_args(["--output_dir", str(tmp_path), "--credit", credit])
        old = {**cfg.to_dict(), "credit": credit.partition("@")[0], "oar_tau": 0.25, "oar_beta": 1.0,
               "oar_floor": 0.1, **fields}
        (tmp_path / "run.json").write_text(json.dumps({"config": old, "train_args": {}}, default=str))

    def resume(credit: str, *extra: str) -> None:
        script, cfg = parse_train_args(["--output_dir", str(tmp_path), "--credit", credit, *extra])
        check_resume(tmp_path, script, cfg)

    stored("oar-p@horizon=2", credit_options={"horizon": 2})
    resume("oar-p@horizon=2")
    with pytest.raises(ValueError, match=r"credit: 'oar-p@horizon=2' -> 'oar-p@horizon=3'"):
        resume("oar-p@horizon=3")
    stored("oar-g", oar_beta=2.0)  # an option field away from its default is part of the credit
    resume("oar-g@beta=2.0")
    with pytest.raises(ValueError, match=r"credit: 'oar-g@beta=2.0' -> 'oar-g'"):
        resume("oar-g")
    stored("gtpo", temperature=0.7)  # an older oar read gtpo's entropy at the sampler's temperature
    resume("gtpo@temperature=0.7", "--temperature", "0.7")
    with pytest.raises(ValueError, match=r"credit: 'gtpo@temperature=0.7' -> 'gtpo'"):
        resume("gtpo", "--temperature", "0.7")


# ---------------------------------------------------------------------------------------------- data as text

BIG = 2**64 + 1  # above int64: pyarrow would round it to a double


@pytest.mark.parametrize("literal, gold", [
    ("1" + "0" * 400, "1" + "0" * 400), ("9" * 400, "9" * 400), (str(BIG), str(BIG)), (str(-BIG), str(-BIG)),
    ("1e400", "1e400"), ("-1.5e400", "-1.5e400"), ("27.0", "27"), ("0.1", "0.1"), ("2.50", "2.50"),
    ("12345678901234567.0", "12345678901234567.0"), ("[1, 2.50]", "1, 2.50"), ('"#### 1,000"', "1000"),
])
@pytest.mark.parametrize("layout", ["jsonl", "json"])
def test_answers_keep_the_files_text(tmp_path, literal, gold, layout):
    """A number in the answer column is read as the text the file holds (pyarrow read 10**400 as inf and rounded
    integers above 2**63); other columns keep their types."""
    row = '{"problem": "q", "answer": ' + literal + ', "id": 7}'
    other = '{"problem": "r", "answer": "x+1", "id": 8}'
    path = tmp_path / f"d.{layout}"
    path.write_text(f"{row}\n{other}\n" if layout == "jsonl" else f"[{row},\n {other}]")
    ds = load_train_dataset(str(path), prompt_template="{question}")
    assert ds[0] == {"prompt": "q", "answer": gold} and ds[1]["answer"] == "x+1"
    from oar.train_data import read_train_dataset

    raw = read_train_dataset(str(path))
    assert raw["id"] == [7, 8] and isinstance(raw[0]["answer"], str)


@pytest.mark.parametrize("row, where, message", [
    ('{"question": "q", "answer": "1", "answer": "2"}', ":2: ", "duplicated key 'answer'"),
    ('{"question": "q", "meta": {"a": 1, "a": 2}, "answer": "2"}', ":2: ", "duplicated key 'a'"),
    ('{"question": "q", "answer": Infinity}', ": line 2: ", "column 'answer' holds a non-finite number"),
    ('{"question": "q", "answer": -Infinity}', ": line 2: ", "column 'answer' holds a non-finite number"),
    ('{"question": "q", "answer": NaN}', ": line 2: ", "column 'answer' holds a non-finite number"),
    ('{"question": "q", "answer": [1, NaN]}', ": line 2: ", "column 'answer' holds a non-finite number"),
    ('{"question": "q", "answer": "1", "score": NaN}', ": line 2: ", "column 'score' holds a non-finite"),
    ('{"question": "q", "answer": "1", "score": 1e999}', ": line 2: ", "column 'score' holds a number beyond"),
    ('[1, 2]', ": line 2: ", "expected a JSON object, got list"),
    ('{"question": "q", "answer": ', ":2: ", "not valid JSON"),
])
def test_damaged_json_rows_are_one_line_naming_file_row_and_column(workspace, capsys, tmp_path, row, where,
                                                                   message):
    root, config = workspace
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "fine", "answer": "1"}\n' + row + "\n")
    code = main(["train", "--config", str(config), "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
                 "--dataset", str(path), "--answer_column", "answer"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"oar train: error: {path}{where}") and message in err


def test_a_json_document_with_a_duplicated_key_names_it(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('[{"problem": "q", "answer": "1"}, {"problem": "q", "problem": "r", "answer": "2"}]')
    with pytest.raises(ValueError, match=f"{path}: duplicated key 'problem'"):
        load_train_dataset(str(path))


def test_an_infinite_answer_in_parquet_is_refused_by_row_and_column(tmp_path):
    pd = pytest.importorskip("pandas")
    path = tmp_path / "d.parquet"
    pd.DataFrame({"problem": ["a", "b", "c"], "answer": [1.0, 2.5, float("-inf")]}).to_parquet(path)
    with pytest.raises(ValueError, match="row 3: column 'answer' holds -inf, not a finite answer"):
        load_train_dataset(str(path))
    pd.DataFrame({"problem": ["a", "b"], "answer": [2**62 + 1, 7]}).to_parquet(path)  # int64 keeps every digit
    assert list(load_train_dataset(str(path), prompt_template="{question}")["answer"]) == [str(2**62 + 1), "7"]


@pytest.mark.parametrize("value", ["0", "-1", "-100"])
def test_max_train_samples_below_one_is_refused_before_any_model_loads(workspace, capsys, tmp_path, value):
    root, config = workspace
    code = main(["train", "--config", str(config), "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
                 "--max_train_samples", value, "--model", str(tmp_path / "no-such-model")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err == f"oar train: error: max_train_samples must be >= 1 (or unset: every row), got {value}"
    assert not (tmp_path / "out").exists()  # refused before the run directory, the data or the model
    from oar.train_data import read_train_dataset

    with pytest.raises(ValueError, match="max_train_samples must be an integer >= 1"):
        read_train_dataset(str(root / "add.jsonl"), "question", "gold", max_samples=int(value))


def test_worked_examples_open_every_prompt_and_are_not_trained_on(tmp_path):
    rows = [{"problem": f"{i}+1=", "answer": str(i + 1), "solution": f"{i}+1={i + 1}, \\boxed{{{i + 1}}}"}
            for i in range(4)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    chat = load_train_dataset(str(path), prompt_template="Q: {question}", conversational=True, worked_examples=2)
    assert len(chat) == 2 and chat[0]["answer"] == "3"  # rows 0 and 1 are the examples
    assert chat[0]["prompt"] == [
        {"role": "user", "content": "Q: 0+1="}, {"role": "assistant", "content": "0+1=1, \\boxed{1}"},
        {"role": "user", "content": "Q: 1+1="}, {"role": "assistant", "content": "1+1=2, \\boxed{2}"},
        {"role": "user", "content": "Q: 2+1="}]
    text = load_train_dataset(str(path), prompt_template="Q: {question}", worked_examples=1)
    assert text[0]["prompt"] == "Q: 0+1=\n0+1=1, \\boxed{1}\n\nQ: 1+1=" and len(text) == 3
    assert load_train_dataset(str(path), prompt_template="Q: {question}")[0]["prompt"] == "Q: 0+1="
    for n in (4, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"worked_examples must be an integer in 0\.\.3"):
            load_train_dataset(str(path), worked_examples=n)
    with pytest.raises(ValueError, match="solution column 'steps'"):
        load_train_dataset(str(path), worked_examples=1, solution_column="steps")


def test_worked_examples_errors_come_before_any_model_loads(workspace, capsys, tmp_path):
    root, config = workspace
    for extra, message in ((["--worked_examples", "-1"], "worked_examples must be >= 0, got -1"),
                           (["--worked_examples", "1"], "worked_examples needs a solution column 'solution'")):
        code = main(["train", "--config", str(config), "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
                     "--model", str(tmp_path / "no-such-model"), *extra])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and message in err, err
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing written


def test_the_bundled_solutions_box_their_own_answers():
    from oar.easy_arithmetic import easy_arithmetic_rows
    from oar.grading import math_reward

    rows = easy_arithmetic_rows(90, seed=5)
    assert math_reward(None, [r["solution"] for r in rows], [r["answer"] for r in rows]) == [1.0] * 90
    wrong = [str(int(r["answer"]) + 1) for r in rows]
    assert math_reward(None, [r["solution"] for r in rows], wrong) == [0.0] * 90
