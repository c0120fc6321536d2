"""``oar eval``: evaluate a model on math benchmarks (argument parsing and wiring only)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    from oar.eval.benchmarks import BENCHMARKS
    from oar.eval.generation import DEFAULT_PROMPT

    p = subparsers.add_parser(
        "eval",
        help="evaluate a model on math benchmarks",
        description="Generate, grade (math-verify) and report accuracy / avg@k / pass@k with 95% intervals. "
        "Results go to OUTPUT_DIR (samples.jsonl, summary.json, eval.md); an interrupted run resumes.",
    )
    p.add_argument(
        "--model",
        required=True,
        help="hub id, local model directory, .gguf file, or 'smollm2' (offline demo model)",
    )
    p.add_argument("--benchmarks", default="gsm8k,math500", help=f"comma-separated: {','.join(BENCHMARKS)}")
    p.add_argument("--data-dir", help="local benchmark files <DIR>/<benchmark>/test.jsonl (default: the hub)")
    p.add_argument("--samples", type=int, default=1, help="samples per problem (1: greedy accuracy)")
    p.add_argument("--temperature", type=float, help="default 0 for one sample, 0.6 for several")
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--limit", type=int, help="first N problems of each benchmark")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per generate call")
    p.add_argument(
        "--prompt-template",
        default=DEFAULT_PROMPT,
        help="user message with a {question} placeholder, or a file holding it",
    )
    p.add_argument(
        "--backend",
        choices=("auto", "transformers", "vllm"),
        default="auto",
        help="auto: vLLM when installed and a GPU is present, else transformers",
    )
    p.add_argument("--dtype", help="e.g. bfloat16 (default: the checkpoint's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", help="default runs/eval/<model name>")
    p.add_argument("--verbose", action="store_true",
                   help="show the libraries' own warnings, logs and progress bars (hidden by default)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from oar.eval.run import EvalConfig, evaluate, format_table
    from oar.files import check_writable_dir
    from oar.quiet import quiet_libraries

    template = args.prompt_template
    if "{question}" not in template and Path(template).is_file():
        template = Path(template).read_text(encoding="utf-8")
    config = EvalConfig(
        model=args.model,
        benchmarks=args.benchmarks,
        data_dir=args.data_dir,
        samples=args.samples,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        limit=args.limit,
        batch_size=args.batch_size,
        prompt_template=template,
        seed=args.seed,
        backend=args.backend,
        dtype=args.dtype,
        output_dir=args.output_dir,
    )
    check_writable_dir(config.output_dir)
    with quiet_libraries(args.verbose):
        summary = evaluate(config)
    print(format_table(summary), end="")
    print(f"results in {config.output_dir}/ (eval.md, summary.json, samples.jsonl)")
    return 0
