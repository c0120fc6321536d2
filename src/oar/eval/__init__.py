"""Benchmark evaluation: loading, generation, grading, metrics and reports (``oar eval``)."""

from oar.eval.benchmarks import BENCHMARKS, BenchmarkSpec, Problem, load_benchmark
from oar.eval.generation import DEFAULT_PROMPT, build_prompt
from oar.eval.metrics import pass_at_k, summarize_benchmark, wilson_interval
from oar.eval.run import EvalConfig, evaluate, format_table

__all__ = [
    "BENCHMARKS",
    "BenchmarkSpec",
    "DEFAULT_PROMPT",
    "EvalConfig",
    "Problem",
    "build_prompt",
    "evaluate",
    "format_table",
    "load_benchmark",
    "pass_at_k",
    "summarize_benchmark",
    "wilson_interval",
]
