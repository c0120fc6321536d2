"""``oar attribute``: colour every completion token by its OAR weight, as an HTML page or in the terminal."""

from __future__ import annotations

import argparse

from oar.cli.parser import add_import_option


def _step(value: str) -> int | str:
    if value == "last":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--step must be an integer or 'last', got {value!r}") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "attribute", help="show where credit goes: each token coloured by its weight",
        description="Render token credit (suppressed tokens cool, boosted warm, answer statement marked). "
        "Reads a trainer dump (RUN_DIR/attributions.jsonl) directly, or computes it with --model.",
    )
    p.add_argument("--model", help="model to score with: hub id, local dir, .gguf file or 'smollm2'")
    p.add_argument("--prompt", help="prompt text (with --completion)")
    p.add_argument("--completion", help="completion text to attribute")
    p.add_argument("--from-jsonl", metavar="FILE",
                   help="attribution records, or {'prompt', 'completion'} rows to score with --model")
    p.add_argument("--credit", action="append", metavar="NAME[@OPT=V&...]",
                   help="credit method or control with its options (see `oar credits`: oar-g, oar-p@horizon=2, "
                   "entropy-mask, ktae, shuffle:oar-g, ...); repeat to compare side by side (default oar-g; for a "
                   "records file: filter). "
                   "Group methods (ktae, gtpo) need rows with a 'reward'; completions of one prompt form a group")
    p.add_argument("--out", metavar="FILE.html", help="write a self-contained HTML page (default: terminal)")
    p.add_argument("--step", type=_step, help="records file: only this training step ('last' for the latest)")
    p.add_argument("--limit", type=int, help="at most this many completions")
    p.add_argument("--chat", action="store_true", help="wrap prompts in the tokenizer's chat template")
    p.add_argument("--batch-size", type=int, default=4, help="completions scored together (default 4)")
    p.add_argument("--title", default="OAR token credit", help="page title")
    add_import_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from oar.cli.parser import import_user_modules
    from oar.viz.records import collect_records

    import_user_modules("oar attribute", args.modules)
    if args.prompt is not None and args.from_jsonl is not None:
        raise ValueError("give either --prompt/--completion or --from-jsonl, not both")
    if args.prompt is None and args.from_jsonl is None:
        raise ValueError("give --prompt and --completion, or --from-jsonl FILE")
    records = collect_records(
        model=args.model, prompt=args.prompt, completion=args.completion, from_jsonl=args.from_jsonl,
        credits=args.credit, step=args.step, limit=args.limit, chat=args.chat, batch_size=args.batch_size,
    )
    if args.out:
        from oar.viz.html import write_html

        print(f"wrote {write_html(args.out, records, args.title)} ({len(records)} records)")
    else:
        from oar.viz.terminal import render_terminal

        render_terminal(records)
    return 0
