"""The prepared GPU check: a GRPO step and the OAR scorers at a real shape, with the fast paths' exactness in bf16.

A randomly initialised model of Qwen2.5-1.5B's configuration (written out below: no hub access is needed), bf16,
SDPA attention, prompt 256 / completion 2,048 tokens, G = 8 completions of one prompt, on one GPU:

1. exactness in bf16: OAR-P's fast path (KV-cached suffixes, chunked copies) against the naive definition
   (one full forward per copy) on ``--check-positions`` reasoning tokens of two probes, the same with a horizon
   of 2 against its own naive definition, and OAR-G batched (ragged rows, padded) against one row at a time; each
   against a float32 copy of the same weights. A fast path passes when its error to float32 is at most ``2 x``
   the naive path's (bf16's own noise) ``+ 1e-6``;
2. the scorers alone on the G probes: OAR-G, G-guided OAR-P (``oar-pg``, default ``k``), OAR-P with a horizon of 2
   (the cheap setting: each copy re-runs 3 columns and the answer's, 64 copies per forward) and exact OAR-P
   (on ``--exact-rows`` rows, extrapolated linearly to G: its cost is linear in the perturbed copies), time and
   peak memory;
3. one step of ``OARGRPOTrainer`` (TRL's generation, no vLLM; TRL's default gradient checkpointing) per credit:
   ``grpo``, ``oar-g``, ``oar-pg``, ``oar-p@horizon=2&chunk_size=64``, ``oar-p``: step time, the scoring share,
   peak memory. A step whose projected time would pass ``--deadline-s`` is skipped (and says so), so the script
   ends in time;
4. the performance goals (docs/scaling.md) from those figures: OAR-G's achieved TFLOP/s (``4 N`` FLOPs per probe
   token: a forward and an inputs-only backward, ``N`` the parameters outside the embedding, attention not
   counted) against ``--peak-tflops``, its share of GRPO's step, and OAR-P ``horizon=2`` against OAR-G.

The tokenizer is a character tokenizer over as many distinct characters as the model has ids (so any sampled
id decodes); every generated completion keeps its length and ends in ``\\boxed{N}``, and the reward gives one
completion of the group 1 (every advantage is non-zero, so every completion is scored, the worst case).
Results go to ``OUT.json`` and ``OUT.md`` after every section (atomic writes).

    python checks/gpu_check.py [--out runs/gpu_check] [--deadline-s 450]
    python checks/gpu_check.py --smoke   # same code, tiny shape, CPU, seconds
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
import unicodedata
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

# Qwen/Qwen2.5-1.5B-Instruct config.json (the values that set the compute)
QWEN25_15B = dict(
    vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
    num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, hidden_act="silu", initializer_range=0.02,
)
SMOKE = dict(QWEN25_15B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
ANSWER = "\n\\boxed{42}"
# OAR-P's cheap setting with a horizon (docs/importance.md): copies re-run few columns, so 64 share a forward
HORIZON_OPTIONS = {"horizon": 2, "chunk_size": 64}
HORIZON_CREDIT = "oar-p@" + "&".join(f"{k}={v}" for k, v in HORIZON_OPTIONS.items())
CREDITS = ("grpo", "oar-g", "oar-pg", HORIZON_CREDIT, "oar-p")
# the performance goals (docs/scaling.md): OAR-G >= 40 % of the bf16 peak and <= 10 % of GRPO's step; OAR-P
# horizon=2 <= 2x OAR-G's scoring time, its bf16 exactness check passing
GOALS = {"oar-g share of peak": 0.40, "oar-g share of grpo step": 0.10, "oar-p horizon / oar-g": 2.0}


@dataclass(frozen=True)
class Shape:
    prompt: int = 256
    completion: int = 2048
    group: int = 8
    check_positions: int = 32
    exact_rows: int = 1


def char_tokenizer(vocab_size: int):
    """A character tokenizer with exactly ``vocab_size`` ids: pad/eos/bos, printable ASCII, then distinct
    letters, symbols and private-use characters of Unicode (no combining marks, spaces, control characters)."""
    from oar.lab.tokenizer import PRINTABLE, build_char_tokenizer

    chars, cp = list(PRINTABLE), 0x100
    while len(chars) < vocab_size - 3:
        c = chr(cp)
        if not 0xD800 <= cp <= 0xDFFF and (unicodedata.category(c)[0] in "LNPS" or unicodedata.category(c) == "Co"):
            chars.append(c)
        cp += 1
    return build_char_tokenizer("".join(chars), padding_side="left")


def build_model(config: dict, device: str):
    """``(bf16 model with SDPA, float32 copy)`` of the same random weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**config, pad_token_id=0, eos_token_id=1, bos_token_id=2, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        fp32 = Qwen2ForCausalLM(cfg).float().eval()
    return copy.deepcopy(fp32).to(torch.bfloat16), fp32


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Measure:
    """Wall seconds and peak memory (GPU: allocated by torch; CPU: process RSS) of a block, in MiB above
    the memory in use when it starts (``peak_total_mib``: the absolute GPU peak)."""

    def __init__(self, device: str) -> None:
        self.device = device

    def __enter__(self) -> Measure:
        sync(self.device)
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            from oar.peak_memory import PeakMemory

            self.host = PeakMemory()
            self.host.start()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        sync(self.device)
        self.seconds = time.perf_counter() - self.t0
        if self.device == "cuda":
            self.peak_total_mib = torch.cuda.max_memory_allocated() / 2**20
            self.peak_mib = self.peak_total_mib - self.base / 2**20
        else:
            self.peak_mib = self.host.peak_mib()
            self.peak_total_mib = None


def make_rows(tok, shape: Shape, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """``group`` prompts of ``prompt`` tokens (the same prompt, as in a GRPO group) and completions of
    ``completion`` tokens ending in :data:`ANSWER`; completion ``b`` is ``b * completion // (4 * group)`` shorter
    (ragged rows, so padding is exercised)."""
    gen = torch.Generator().manual_seed(seed)
    answer = tok(ANSWER, add_special_tokens=False)["input_ids"]
    prompt = torch.randint(3, len(tok), (shape.prompt,), generator=gen).tolist()
    completions = []
    for b in range(shape.group):
        n = shape.completion - b * shape.completion // (4 * shape.group) - len(answer)
        completions.append(torch.randint(3, len(tok), (n,), generator=gen).tolist() + answer)
    return [prompt] * shape.group, completions


def probes(tok, prompts, completions, device: str):
    from oar.probe import OutcomeProbe, rollout_tensors

    pb = OutcomeProbe(tok)(*rollout_tensors(prompts, completions))
    if not pb.valid.all():
        raise RuntimeError("gpu_check: a probe is invalid (the answer was not located)")
    return pb.to(device)


def error_to(ref: torch.Tensor, x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    from oar.attribution import rank_correlation

    r, v = ref[mask].double(), x[mask].double()
    return {"max_abs": (r - v).abs().max().item(), "scale": r.abs().max().item(),
            "spearman": round(rank_correlation(r.cpu(), v.cpu()), 4)}


def exactness(model, fp32, pb, shape: Shape) -> dict:
    """bf16 fast paths vs bf16 naive paths, both against float32 (see the module docstring)."""
    from oar import gradient_scores, perturbation_scores
    from oar.importance import perturbation_scores_naive

    ids, am, rm, ans = pb.input_ids, pb.attention_mask, pb.reasoning_mask, pb.answer_mask
    # OAR-P: check_positions reasoning tokens of rows 0 and 1 (their copies share forwards), evenly spaced
    rows = min(2, ids.shape[0])
    sub = torch.zeros_like(rm[:rows])
    for b in range(rows):
        pos = rm[b].nonzero().squeeze(1)
        n = min(max(shape.check_positions // rows, 1), pos.numel())
        sub[b, pos[torch.linspace(0, pos.numel() - 1, n).round().long()]] = True
    one = (ids[:rows], am[:rows], sub, ans[:rows])
    ref = perturbation_scores_naive(fp32, *one)
    fast = perturbation_scores(model, *one)
    naive = perturbation_scores_naive(model, *one)
    p_fast, p_naive = error_to(ref, fast, sub), error_to(ref, naive, sub)
    h = HORIZON_OPTIONS["horizon"]
    h_ref = perturbation_scores_naive(fp32, *one, horizon=h)
    h_fast = perturbation_scores(model, *one, **HORIZON_OPTIONS)
    h_naive = perturbation_scores_naive(model, *one, horizon=h)
    h_fast_err, h_naive_err = error_to(h_ref, h_fast, sub), error_to(h_ref, h_naive, sub)
    # OAR-G: the padded batch at once vs one row at a time (answer_joint, σ = 0: deterministic)
    g_opts = {"mode": "answer_joint", "noise_std": 0.0}
    ref = gradient_scores(fp32, ids, am, rm, ans, batch_size=1, **g_opts)
    batched = gradient_scores(model, ids, am, rm, ans, **g_opts)
    single = gradient_scores(model, ids, am, rm, ans, batch_size=1, **g_opts)
    g_fast, g_single = error_to(ref, batched, rm), error_to(ref, single, rm)

    def verdict(fast_err: dict, naive_err: dict) -> bool:
        return fast_err["max_abs"] <= 2 * naive_err["max_abs"] + 1e-6

    return {
        "tolerance": "fast path error to float32 <= 2 x the naive bf16 path's error to float32 + 1e-6",
        "oar-p": {"positions": int(sub.sum()), "fast_vs_fp32": p_fast, "naive_vs_fp32": p_naive,
                  "fast_vs_naive_max_abs": (fast - naive)[sub].abs().max().item(), "pass": verdict(p_fast, p_naive)},
        "oar-p horizon": {"positions": int(sub.sum()), "horizon": h, "fast_vs_fp32": h_fast_err,
                          "naive_vs_fp32": h_naive_err, "pass": verdict(h_fast_err, h_naive_err)},
        "oar-g": {"rows": int(ids.shape[0]), "batched_vs_fp32": g_fast, "one_row_vs_fp32": g_single,
                  "pass": verdict(g_fast, g_single)},
    }


def scorers_alone(model, pb, shape: Shape, device: str) -> dict:
    from oar import gradient_scores, perturbation_scores
    from oar.credit import get_credit
    from oar.importance.guided import guided_perturbation_scores

    inputs = (model, pb.input_ids, pb.attention_mask, pb.reasoning_mask, pb.answer_mask)
    gen = torch.Generator(device=device).manual_seed(0)
    tokens = int(pb.attention_mask.sum())
    body = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    out = {}
    with Measure(device) as m:
        gradient_scores(*inputs, generator=gen)
    out["oar-g"] = {"rows": shape.group, "seconds": m.seconds, "peak_mib": m.peak_mib, "tokens": tokens,
                    "tflops": 4 * body * tokens / m.seconds / 1e12}
    k = get_credit("oar-pg").options["k"]
    with Measure(device) as m:
        guided_perturbation_scores(*inputs, generator=gen)
    out["oar-pg"] = {"rows": shape.group, "k": k, "seconds": m.seconds, "peak_mib": m.peak_mib}
    with Measure(device) as m:
        perturbation_scores(*inputs, **HORIZON_OPTIONS)
    out["oar-p horizon"] = {"rows": shape.group, **HORIZON_OPTIONS, "seconds": m.seconds, "peak_mib": m.peak_mib}
    n = min(shape.exact_rows, shape.group)
    with Measure(device) as m:
        perturbation_scores(*(t[:n] if isinstance(t, torch.Tensor) else t for t in inputs))
    out["oar-p"] = {"rows": n, "seconds": m.seconds, "peak_mib": m.peak_mib,
                    "seconds_for_group": m.seconds * shape.group / n, "extrapolated": n < shape.group}
    return out


def trainer_step(model, tok, column: str, shape: Shape, device: str) -> dict:
    import datasets
    from transformers import PrinterCallback

    from oar.trainer import OARConfig, OARGRPOTrainer

    if not hasattr(OARGRPOTrainer, "_generate_single_turn"):
        raise RuntimeError("gpu_check: this TRL has no GRPOTrainer._generate_single_turn to append the answer to")
    answer = tok(ANSWER, add_special_tokens=False)["input_ids"]

    class Trainer(OARGRPOTrainer):
        def _generate_single_turn(self, *args, **kwargs):
            """TRL's generation; then each completion's last tokens become the answer (same length)."""
            completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
            return [list(ids[: max(len(ids) - len(answer), 0)]) + answer for ids in completion_ids], logprobs

    def reward(completions, **kwargs):
        return [float(i % shape.group == 0) for i in range(len(completions))]

    prompts, _ = make_rows(tok, shape)
    ds = datasets.Dataset.from_list([{"prompt": tok.decode(prompts[0])}] * shape.group)
    with tempfile.TemporaryDirectory() as tmp:
        args = OARConfig(
            output_dir=tmp, credit=column, use_cpu=device == "cpu",
            bf16=device == "cuda", seed=0,
            per_device_train_batch_size=shape.group, num_generations=shape.group,
            max_completion_length=shape.completion, temperature=1.0, max_steps=1, learning_rate=1e-6,
            logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, oar_batch_size=shape.group,
        )
        trainer = Trainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)
        trainer.remove_callback(PrinterCallback)
        with Measure(device) as m:
            trainer.train()
    logs = next(h for h in trainer.state.log_history if "step_time" in h)
    del trainer
    out = {"step_time": logs["step_time"], "wall_seconds": m.seconds, "peak_mib": m.peak_mib,
           "peak_total_mib": m.peak_total_mib, "completion_tokens": logs.get("completions/mean_length")}
    if args.resolved_credit.method.acts:
        out |= {"importance_time": logs["oar/importance_time"], "frac_scored": logs["oar/frac_scored"]}
    return out


def goals(res: dict, peak_tflops: float) -> dict:
    """Each goal of :data:`GOALS`: ``{"value", "goal", "met"}`` (value None where a figure it needs is missing)."""
    sc, grpo = res["scorers"], res["steps"].get("grpo", {}).get("step_time")
    values = {"oar-g share of peak": sc["oar-g"]["tflops"] / peak_tflops,
              "oar-g share of grpo step": sc["oar-g"]["seconds"] / grpo if grpo else None,
              "oar-p horizon / oar-g": sc["oar-p horizon"]["seconds"] / sc["oar-g"]["seconds"]}
    out = {}
    for name, goal in GOALS.items():
        v = values[name]
        met = None if v is None else (v >= goal if name.endswith("of peak") else v <= goal)
        if name == "oar-p horizon / oar-g" and met is not None:
            met = met and res["exactness"]["oar-p horizon"]["pass"]
        out[name] = {"value": v, "goal": goal, "met": met}
    return out


def markdown(res: dict) -> str:
    s, shape = res["setup"], res["setup"]["shape"]
    name = "tiny (smoke)" if s["smoke"] else "Qwen2.5-1.5B"
    lines = [f"# GPU check ({s['device_name']})", "",
             f"Model: random {name} config ({s['params'] / 1e6:.1f} M params), bf16, SDPA; prompt "
             f"{shape['prompt']} / completion {shape['completion']} / G = {shape['group']}; torch {s['torch']}, "
             f"transformers {s['transformers']}, trl {s['trl']}. Total {res.get('total_s', 0):.0f} s.", ""]
    if "exactness" in res:
        e = res["exactness"]
        lines += ["## Exactness in bf16", "", f"Tolerance: {e['tolerance']}.", "",
                  "| path | fast: max abs to fp32 | naive / one row: max abs to fp32 | score scale "
                  "| Spearman fast vs fp32 | pass |", "|---|---|---|---|---|---|"]
        for label, r, fast, slow in (
            (f"OAR-P fast vs naive ({e['oar-p']['positions']} positions)", e["oar-p"], "fast_vs_fp32", "naive_vs_fp32"),
            (f"OAR-P horizon {e['oar-p horizon']['horizon']} fast vs naive", e["oar-p horizon"], "fast_vs_fp32",
             "naive_vs_fp32"),
            (f"OAR-G batched vs one row ({e['oar-g']['rows']} rows)", e["oar-g"], "batched_vs_fp32", "one_row_vs_fp32"),
        ):
            lines.append(f"| {label} | {r[fast]['max_abs']:.3g} | {r[slow]['max_abs']:.3g} | {r[slow]['scale']:.3g} "
                         f"| {r[fast]['spearman']} | {r['pass']} |")
        lines.append("")
    if "scorers" in res:
        lines += ["## Scorers alone (G probes)", "", "| scorer | rows | seconds | seconds for G rows | peak MiB |",
                  "|---|---|---|---|---|"]
        for label, r in res["scorers"].items():
            per_g = r.get("seconds_for_group", r["seconds"])
            note = " (extrapolated)" if r.get("extrapolated") else ""
            lines.append(f"| {label} | {r['rows']} | {r['seconds']:.2f} | {per_g:.2f}{note} | {r['peak_mib']:.0f} |")
        lines.append("")
    if "steps" in res:
        ref = res["steps"].get("grpo", {}).get("step_time")
        lines += ["## One OARGRPOTrainer step per credit", "",
                  "| credit | step s | x grpo | scoring s | peak MiB (step) | peak MiB (total) |",
                  "|---|---|---|---|---|---|"]
        for label, r in res["steps"].items():
            if "skipped" in r:
                lines.append(f"| {label} | skipped: {r['skipped']} | | | | |")
                continue
            ratio = f"{r['step_time'] / ref:.2f}" if ref else "–"
            total = f"{r['peak_total_mib']:.0f}" if r["peak_total_mib"] is not None else "–"
            lines.append(f"| {label} | {r['step_time']:.1f} | {ratio} | {r.get('importance_time', 0.0):.1f} | "
                         f"{r['peak_mib']:.0f} | {total} |")
        lines.append("")
    if "goals" in res:
        g = res["goals"]
        lines += ["## Performance goals", "",
                  f"OAR-G {res['scorers']['oar-g']['tflops']:.1f} TFLOP/s (4 N FLOPs per probe token) against a "
                  f"bf16 peak of {s['peak_tflops']:g} TFLOP/s.", "",
                  "| goal | value | target | met |", "|---|---|---|---|"]
        for name, r in g.items():
            value = "–" if r["value"] is None else f"{r['value']:.3g}"
            sign = ">=" if name.endswith("of peak") else "<="
            lines.append(f"| {name} | {value} | {sign} {r['goal']:g} | {r['met']} |")
    return "\n".join(lines) + "\n"


def write(res: dict, out: Path) -> None:
    """``OUT.json`` and ``OUT.md``, each written to a temporary file and renamed (atomic)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, text in ((out.with_suffix(".json"), json.dumps(res, indent=1)), (out.with_suffix(".md"), markdown(res))):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shape on CPU (CI): the same code in seconds")
    ap.add_argument("--out", default="runs/gpu_check", help="writes OUT.json and OUT.md")
    ap.add_argument("--deadline-s", type=float, default=450.0, help="skip trainer steps projected to end later")
    ap.add_argument("--credits", default=",".join(CREDITS))
    ap.add_argument("--exact-rows", type=int, default=1, help="rows of the exact OAR-P scorer timed alone")
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="the device's dense bf16 peak, TFLOP/s (989: H100/H200 SXM), for the goals")
    a = ap.parse_args(argv)
    credits = [c.strip() for c in a.credits.split(",") if c.strip()]
    from oar.credit import CreditSpec

    for c in credits:
        CreditSpec.parse(c).resolve()  # ValueError naming an unknown credit or option, before any model is built
    if a.exact_rows < 1 or a.deadline_s <= 0 or a.peak_tflops <= 0:
        ap.error(f"--exact-rows must be >= 1, --deadline-s and --peak-tflops > 0, got {a.exact_rows}, "
                 f"{a.deadline_s}, {a.peak_tflops}")
    if a.smoke:
        device, config, shape = "cpu", SMOKE, Shape(prompt=12, completion=40, group=4, check_positions=6)
    else:
        if not torch.cuda.is_available():
            sys.exit("gpu_check: no CUDA device (use --smoke for the CPU run)")
        device, config, shape = "cuda", QWEN25_15B, Shape()
    shape = replace(shape, exact_rows=a.exact_rows)
    torch.manual_seed(0)
    t_start = time.perf_counter()
    out = Path(a.out)

    import transformers
    import trl

    tok = char_tokenizer(config["vocab_size"])
    model, fp32 = build_model(config, device)
    res: dict = {"setup": {
        "device": device, "device_name": torch.cuda.get_device_name() if device == "cuda" else "CPU (smoke)",
        "shape": asdict(shape), "config": config, "params": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
        "smoke": a.smoke, "peak_tflops": a.peak_tflops}}
    prompts, completions = make_rows(tok, shape)
    pb = probes(tok, prompts, completions, device)
    res["exactness"] = exactness(model, fp32, pb, shape)
    del fp32
    write(res, out)
    res["scorers"] = scorers_alone(model, pb, shape, device)
    write(res, out)
    res["steps"] = {}
    for credit in credits:
        done = res["steps"]
        base = done.get("grpo", {}).get("step_time")
        extra = {"oar-p": res["scorers"]["oar-p"]["seconds_for_group"], "oar-pg": res["scorers"]["oar-pg"]["seconds"],
                 "oar-g": res["scorers"]["oar-g"]["seconds"],
                 HORIZON_CREDIT: res["scorers"]["oar-p horizon"]["seconds"]}.get(credit, 0.0)
        projected = (base or 0.0) + extra
        elapsed = time.perf_counter() - t_start
        if elapsed + projected > a.deadline_s:
            done[credit] = {"skipped": f"projected {projected:.0f} s after {elapsed:.0f} s "
                                       f"> --deadline-s {a.deadline_s:.0f}"}
        else:
            done[credit] = trainer_step(model, tok, credit, shape, device)
        res["goals"] = goals(res, a.peak_tflops)  # in every write: a run stopped by its timeout keeps them
        res["total_s"] = time.perf_counter() - t_start
        write(res, out)
        if device == "cuda":
            torch.cuda.empty_cache()
    res["total_s"] = time.perf_counter() - t_start
    write(res, out)
    print(markdown(res))
    return res


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
