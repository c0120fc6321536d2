"""``evaluate``: generate, grade and summarise a model on math benchmarks, resumable from its JSONL.

Output directory: ``config.json`` (the settings the samples belong to), ``samples.jsonl`` (one line per
sample: prompt, completion, extracted answer, gold, correct), ``summary.json`` and ``eval.md``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oar.eval.benchmarks import Problem, load_benchmark, parse_benchmarks
from oar.eval.generation import DEFAULT_PROMPT, HFGenerator, VLLMGenerator, build_prompt, check_template
from oar.eval.metrics import summarize_benchmark
from oar.files import append_jsonl, atomic_write
from oar.grading import extract_answer, grade_answers

# settings that change what a sample is: a resumed run must agree on all of them
_SAMPLE_KEYS = (
    "model",
    "data_dir",
    "samples",
    "temperature",
    "top_p",
    "max_new_tokens",
    "prompt_template",
    "seed",
    "batch_size",  # with seed: the random draws of every batch
)


@dataclass
class EvalConfig:
    """What to evaluate and how. ``temperature`` None: 0 (greedy) for one sample, 0.6 for several."""

    model: str
    benchmarks: list[str] = field(default_factory=lambda: ["gsm8k", "math500"])
    data_dir: str | None = None
    samples: int = 1
    temperature: float | None = None
    top_p: float = 0.95
    max_new_tokens: int = 512
    limit: int | None = None
    batch_size: int = 8
    prompt_template: str = DEFAULT_PROMPT
    seed: int = 0
    backend: str = "auto"  # auto | transformers | vllm
    dtype: str | None = None
    output_dir: str | None = None

    def __post_init__(self) -> None:
        self.benchmarks = parse_benchmarks(self.benchmarks)
        check_template(self.prompt_template)
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if value is not None and not _finite_number(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.temperature is None:
            self.temperature = 0.0 if self.samples == 1 else 0.6
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        if self.samples > 1 and self.temperature <= 0:
            raise ValueError(
                f"{self.samples} samples per problem need a temperature > 0, got {self.temperature}"
            )
        if self.temperature == 0:
            self.top_p = 1.0
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        if self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError(
                f"batch_size and max_new_tokens must be >= 1, got {self.batch_size} and {self.max_new_tokens}"
            )
        if self.backend not in ("auto", "transformers", "vllm"):
            raise ValueError(f"backend must be auto, transformers or vllm, got {self.backend!r}")
        if self.data_dir is not None:
            if not Path(self.data_dir).is_dir():
                raise FileNotFoundError(f"data directory not found: {self.data_dir}")
            self.data_dir = str(Path(self.data_dir).resolve())
        if self.output_dir is None:
            slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(self.model.rstrip("/")).name or self.model)
            self.output_dir = str(Path("runs") / "eval" / slug)


def _finite_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


# what each field of a stored sample must be: (check, description)
_RECORD_FIELDS: dict[str, tuple[Any, str]] = {
    "benchmark": (lambda v: isinstance(v, str), "text"),
    "index": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0"),
    "sample": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0"),
    "prompt": (lambda v: isinstance(v, str), "text"),
    "completion": (lambda v: isinstance(v, str), "text"),
    "extracted": (lambda v: v is None or isinstance(v, str), "text or null"),
    "gold": (lambda v: isinstance(v, str), "text"),
    "correct": (lambda v: isinstance(v, bool), "true or false"),
}


def read_samples(path: Path, samples: int) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Finished problems of a (possibly interrupted) JSONL: ``(benchmark, index) -> records by sample``.

    A problem counts only when all ``samples`` of it are present. A line cut short by an interrupted write (an
    object that never closes, also once a resumed run has appended after it) is ignored: its problem is generated
    again. Any other damaged line (not JSON, not an object, a field missing or of another type such as
    ``"correct": "yes"``, a sample number outside ``0..samples-1``) is a ValueError naming the file and line.
    """
    found: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    if not path.is_file():
        return {}
    how = "; fix or delete that line to generate its problem again, or choose another --output-dir"
    with open(path, encoding="utf-8", errors="replace") as f:
        for line_no, line in enumerate(f, 1):
            text = line.strip()
            if not text:
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as err:
                if text.startswith("{") and not text.endswith("}"):  # torn by an interrupted write
                    continue
                raise ValueError(f"{path}:{line_no}: not valid JSON ({err.msg}){how}") from err
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{line_no}: expected a JSON object, got {type(rec).__name__}{how}")
            for key, (ok, what) in _RECORD_FIELDS.items():
                if key not in rec:
                    raise ValueError(f"{path}:{line_no}: a stored sample without {key!r}{how}")
                if not ok(rec[key]):
                    raise ValueError(f"{path}:{line_no}: {key!r} must be {what}, got {rec[key]!r}{how}")
            if rec["sample"] >= samples:
                raise ValueError(f"{path}:{line_no}: sample {rec['sample']} in a run of {samples} sample(s) per "
                                 f"problem{how}")
            found.setdefault((rec["benchmark"], rec["index"]), {})[rec["sample"]] = rec
    return {k: [v[s] for s in range(samples)] for k, v in found.items() if set(v) >= set(range(samples))}


def _check_resume(out: Path, config: EvalConfig) -> dict[str, Any]:
    """The settings the samples in ``out`` must share (written to ``config.json`` with the first sample, so a
    run that failed before generating anything leaves nothing that blocks the corrected rerun)."""
    wanted = {k: getattr(config, k) for k in _SAMPLE_KEYS}
    path = out / "config.json"
    jsonl = out / "samples.jsonl"
    for name in ("config.json", "samples.jsonl", "summary.json", "eval.md"):  # written later: files or nothing
        if (out / name).exists() and not (out / name).is_file():
            raise ValueError(f"{out / name} is not a file; move it away or choose another --output-dir")
    if path.is_file() and jsonl.is_file() and jsonl.stat().st_size:
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: cannot read the settings of the stored samples ({err}); delete it to "
                             "resume without checking them, or choose another --output-dir") from err
        if not isinstance(stored, dict):
            raise ValueError(f"{path}: expected a JSON object of settings, got {type(stored).__name__}; delete "
                             "it to resume without checking them, or choose another --output-dir")
        # keys an older config.json lacks are not compared
        diff = {k: (stored.get(k), v) for k, v in wanted.items() if k in stored and stored[k] != v}
        if diff:
            raise ValueError(
                f"{out} holds samples of other settings {diff} (stored, requested); pass another --output-dir"
            )
    return wanted


def _make_generator(config: EvalConfig) -> tuple[Any, Any]:
    """(generate callable, tokenizer) for the configured backend."""
    from oar.eval.generation import vllm_available
    from oar.models import load_model_and_tokenizer, model_source

    use_vllm = config.backend == "vllm" or (config.backend == "auto" and vllm_available())
    if use_vllm:
        if not vllm_available():
            raise ValueError("backend 'vllm' needs the vllm package and a CUDA GPU")
        from transformers import AutoTokenizer

        source = model_source(config.model)
        return VLLMGenerator(source, dtype=config.dtype or "auto"), AutoTokenizer.from_pretrained(source)
    import torch

    model, tokenizer = load_model_and_tokenizer(config.model, dtype=config.dtype)
    if torch.cuda.is_available():
        model = model.to("cuda")
    return HFGenerator(model, tokenizer), tokenizer


def _records(
    problem: Problem, prompt: str, completions: list[str], verdicts: list[bool]
) -> list[dict[str, Any]]:
    return [
        {
            "benchmark": problem.benchmark,
            "index": problem.index,
            "sample": s,
            "prompt": prompt,
            "completion": c,
            "extracted": extract_answer(c),
            "gold": problem.gold,
            "correct": ok,
        }
        for s, (c, ok) in enumerate(zip(completions, verdicts, strict=True))
    ]


def format_table(summary: dict[str, Any]) -> str:
    """The summary as a Markdown table (percentages, 95% intervals in brackets)."""
    cfg = summary["config"]
    k = cfg["samples"]
    metrics = ["accuracy"] if k == 1 else [f"avg@{k}", f"pass@{k}"]
    head = (
        f"**{cfg['model']}** — "
        + ("greedy" if k == 1 else f"{k} samples, temperature {cfg['temperature']}, top-p {cfg['top_p']}")
        + f", max {cfg['max_new_tokens']} new tokens"
    )
    lines = [
        head,
        "",
        "| benchmark | problems | " + " | ".join(metrics) + " | answered |",
        "|---|---:|" + "---:|" * (len(metrics) + 1),
    ]
    for name, res in summary["benchmarks"].items():
        cells = []
        for m in metrics:
            lo, hi = res["metrics"][m]["ci95"]
            cells.append(f"{100 * res['metrics'][m]['mean']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]")
        cells.append(f"{100 * res['answered']:.1f}")
        lines.append(f"| {name} | {res['problems']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"Percent, 95% interval in brackets; answered: samples with an extractable final answer; "
        f"wall time {summary['wall_s']:.0f} s."
    )
    return "\n".join(lines) + "\n"


def evaluate(config: EvalConfig, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) an evaluation; returns the summary also written to ``summary.json``/``eval.md``.

    ``progress``: one live line per benchmark with its running accuracy over the samples graded so far."""
    from oar.progress import ProgressLines

    t0 = time.perf_counter()
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings = _check_resume(out, config)
    jsonl = out / "samples.jsonl"
    done = read_samples(jsonl, config.samples)
    problems = {b: load_benchmark(b, config.data_dir, config.limit) for b in config.benchmarks}
    empty = [b for b, ps in problems.items() if not ps]
    if empty:
        where = f" in {config.data_dir}" if config.data_dir else ""
        raise ValueError(f"benchmark {empty[0]!r}{where} has no problems (an empty test.jsonl?)")
    pending = [p for ps in problems.values() for p in ps if (p.benchmark, p.index) not in done]

    if pending:
        generate, tokenizer = _make_generator(config)
        every = [p for ps in problems.values() for p in ps]
        prompts = {id(p): build_prompt(p.question, tokenizer, config.prompt_template) for p in every}
        # a fixed layout of every problem (similar lengths share a batch), seeded by the batch's place in it:
        # a problem gets the same samples whether it is generated in the first run or after a resume
        every.sort(key=lambda p: (p.benchmark, len(prompts[id(p)])))
        size = config.batch_size
        batches = [(start, every[start : start + size]) for start in range(0, len(every), size)]
        batches = [(start, b) for start, b in batches if any((p.benchmark, p.index) not in done for p in b)]
        todo_by = {b: sum(p.benchmark == b for p in pending) for b in problems}
        lines = ProgressLines({f"eval {b}": n for b, n in todo_by.items() if n}, enabled=progress)
        graded = {b: [0, 0] for b in problems}  # correct, samples
        for start, batch in batches:
            texts = [prompts[id(p)] for p in batch]
            completions = generate(
                texts,
                samples=config.samples,
                temperature=config.temperature,
                top_p=config.top_p,
                max_new_tokens=config.max_new_tokens,
                seed=config.seed + start,
            )
            todo = [i for i, p in enumerate(batch) if (p.benchmark, p.index) not in done]
            verdicts = grade_answers(
                [c for i in todo for c in completions[i]],
                [batch[i].gold for i in todo for _ in range(config.samples)],
            )
            if not (out / "config.json").is_file() or not (jsonl.is_file() and jsonl.stat().st_size):
                atomic_write(out / "config.json", json.dumps(settings, indent=2) + "\n")
            new = []
            for j, i in enumerate(todo):
                vs = verdicts[j * config.samples : (j + 1) * config.samples]
                recs = _records(batch[i], texts[i], completions[i], vs)
                new += recs
                done[(batch[i].benchmark, batch[i].index)] = recs
            append_jsonl(jsonl, new, ensure_ascii=False)
            for j, i in enumerate(todo):
                name = batch[i].benchmark
                graded[name][0] += sum(verdicts[j * config.samples : (j + 1) * config.samples])
                graded[name][1] += config.samples
                acc = graded[name][0] / graded[name][1]
                lines.advance(f"eval {name}", acc=f"{100 * acc:.1f}%")
        lines.close()

    summary: dict[str, Any] = {"config": dataclasses.asdict(config), "benchmarks": {}}
    for name, ps in problems.items():
        recs = [done[(name, p.index)] for p in ps]
        answered = sum(r["extracted"] is not None for rs in recs for r in rs) / (len(ps) * config.samples)
        summary["benchmarks"][name] = {
            "problems": len(ps),
            "metrics": summarize_benchmark([[r["correct"] for r in rs] for rs in recs]),
            "answered": answered,
        }
    summary["wall_s"] = time.perf_counter() - t0
    summary["generated_problems"] = len(pending)
    atomic_write(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    atomic_write(out / "eval.md", format_table(summary))
    return summary
