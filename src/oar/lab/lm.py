"""The language-model lab: the lab's arithmetic task posed to a pretrained LM (SmolLM2-135M-Instruct) through its
chat template, its character labels carried to the LM's BPE tokens, and a cached supervised warm start.

The task, its labels, slips and oracles are the character lab's (:mod:`oar.lab.task`); what changes is the model
and its tokens. A prompt is the lab prompt as the user turn of the chat template; the worked solution is the
assistant turn, ended by the template's end-of-turn token. A token's label is read from the characters it covers
(:func:`token_labels`). The warm start fine-tunes the LM on demonstrations with slips (full fine-tune or LoRA,
:class:`LMWarmStartConfig`), so it knows the format and still makes mistakes that RL can fix; it is cached on disk
under a hash of its configuration, as the character lab's warm start is (docs/lab.md, "The language-model lab").
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from oar.cache import cache_dir as oar_cache_dir
from oar.files import replace_dir
from oar.lab.task import (
    ANSWER,
    DISTRACTOR,
    FILLER,
    PIVOTAL,
    STRUCTURE,
    LabProblem,
    TaskConfig,
)
from oar.lab.warmstart import train_batch, warmup_cosine
from oar.progress import ProgressLines

LM_CACHE_VERSION = 1
LM_MODELS = ("smollm2",)  # the pretrained models the LM lab runs (oar.models aliases; offline)
LABS = ("char", *LM_MODELS)  # oar compare --lab: the character lab's tiny model, or a pretrained LM
# the LM lab's RL recipe (RunConfig fields; every preset) and its study protocol (every preset but --quick, which
# keeps LM_QUICK and a LM_QUICK_WARM_STEPS-step warm start), chosen with GRPO pilots before any credit study
# (docs/lab.md, "The language-model lab")
# the sampler and loss pass of oar train's one-process CPU path (docs/results/lm_step.md): the same function of the
# weights as TRL's to float32 rounding, a group's shared prompt encoded once
LM_RECIPE = {"prompts_per_step": 4, "group_size": 4, "lr": 5e-6, "freeze_embeddings": False, "train_pool": 5000,
             "oar": {"oar_fast_sampler": True, "oar_share_prompt": True}}
LM_PROTOCOL = {"budget_s": 1200.0, "eval_every": 10, "eval_problems": 128, "eval_k": 2}
LM_QUICK = {"budget_s": 20.0, "eval_every": 2, "eval_problems": 8, "eval_k": 1}
LM_QUICK_WARM_STEPS = 4
# a token covering characters of several labels takes the first of these it covers: a token holding a digit the
# answer is computed from is pivotal, one opening the answer statement is the answer
LABEL_PRIORITY = (PIVOTAL, ANSWER, DISTRACTOR, FILLER, STRUCTURE)


def token_labels(offsets: Sequence[tuple[int, int]], char_labels: Sequence[int]) -> list[int]:
    """One task label per token from the labels of the characters it covers.

    ``offsets``: each token's ``[start, end)`` character span in the text (a tokenizer's offset mapping);
    ``char_labels``: one label per character. A token covering characters of several labels takes the first of
    :data:`LABEL_PRIORITY` among them; ``STRUCTURE`` (operators, separators and their spaces) comes last, so a
    space merged into a word takes the word's label (``" ok"`` is filler, ``" \\"`` opening ``\\boxed`` the
    answer) and a token holding any digit the answer is computed from is pivotal. A token covering no character
    (a special token) gets -1.
    """
    out = []
    for start, end in offsets:
        covered = list(range(max(start, 0), min(end, len(char_labels))))
        if not covered:
            out.append(-1)
            continue
        labels = {char_labels[i] for i in covered}
        out.append(next(lab for lab in LABEL_PRIORITY if lab in labels))
    return out


def token_char_spans(tokenizer: Any, ids: Sequence[int]) -> list[tuple[int, int]]:
    """Each token's ``[start, end)`` span in ``tokenizer.decode(ids, skip_special_tokens=True)``, by decoding
    growing prefixes (a byte-level token that completes a character owns it; special tokens get empty spans)."""
    spans, done = [], 0
    for k in range(len(ids)):
        n = len(tokenizer.decode(list(ids[: k + 1]), skip_special_tokens=True))
        n = max(n, done)
        spans.append((done, n))
        done = n
    return spans


def char_positions_to_tokens(spans: Sequence[tuple[int, int]], positions: Sequence[int]) -> list[int]:
    """The indices of the tokens (by ``spans``, :func:`token_char_spans`) covering any of the character
    ``positions``, in order."""
    marked = set(positions)
    return [t for t, (s, e) in enumerate(spans) if any(i in marked for i in range(s, e))]


def chat_prompt(tokenizer: Any, prompt: str) -> str:
    """The lab prompt as the user turn of the tokenizer's chat template, ready for the assistant's answer."""
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


@dataclass(frozen=True)
class LMWarmStartConfig:
    """The LM lab's warm start: ``steps`` AdamW steps of ``batch_size`` fresh train problems of ``task`` (test
    prompts excluded; with slips), loss on the assistant turn only, linear warm-up then cosine decay to
    ``min_lr_ratio * lr``. ``bf16``: the lab's numerics, in the warm start and in every RL run from it: bf16
    autocast over fp32 weights (rollouts and evaluation sampled from a bf16 copy) when True, fp32 throughout
    when False; None (the default) picks True on a CPU with fast bf16 matmuls, False elsewhere
    (:func:`oar.cpu.fast_bf16`: emulated bf16 is ~50x slower than fp32), resolved at construction.
    ``lora_rank`` 0 fine-tunes every weight; > 0 trains LoRA
    adapters of that rank on every linear layer of the blocks (alpha = 2 x rank) and merges them into the weights
    it saves. ``model``: one of :data:`LM_MODELS`."""

    task: TaskConfig = field(default_factory=lambda: TaskConfig(slip_rate=0.2))
    model: str = "smollm2"
    steps: int = 150
    batch_size: int = 16
    lr: float = 5e-5
    lora_rank: int = 0
    warmup: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    seed: int = 0
    bf16: bool | None = None

    def __post_init__(self) -> None:
        if self.bf16 is None:
            from oar.cpu import fast_bf16

            object.__setattr__(self, "bf16", fast_bf16())
        if not isinstance(self.bf16, bool):
            raise ValueError(f"bf16 must be true, false or unset (this CPU's choice), got {self.bf16!r}")
        if self.model not in LM_MODELS:
            raise ValueError(f"LM lab model must be one of {LM_MODELS}, got {self.model!r}")
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be >= 0 (0: full fine-tune), got {self.lora_rank}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr}")

    def key(self) -> str:
        """The cache key: a hash of every field; ``bf16=True``, the numerics of the first cached warm starts, is
        left out of it so those stay valid."""
        fields = {k: v for k, v in asdict(self).items() if not (k == "bf16" and v)}
        blob = json.dumps({"v": LM_CACHE_VERSION, **fields, "task": self.task.key_fields()}, sort_keys=True)
        return "lm-" + hashlib.sha1(blob.encode()).hexdigest()[:16]


def sft_rows(tokenizer: Any, problems: Sequence[LabProblem]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ``input_ids, attention_mask, labels [B, L]``: chat prompt, then the worked solution and the
    end-of-turn token; labels -100 except on the solution and that token (left padding puts every row's
    solution at the end, so the loss needs logits for the last positions only)."""
    rows, labs = [], []
    for p in problems:
        prompt = tokenizer(chat_prompt(tokenizer, p.prompt), add_special_tokens=False)["input_ids"]
        comp = tokenizer(p.completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt + comp)
        labs.append([-100] * len(prompt) + comp)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lab) in enumerate(zip(rows, labs, strict=True)):
        ids[i, width - len(r):] = torch.tensor(r)
        labels[i, width - len(lab):] = torch.tensor(lab)
        mask[i, width - len(r):] = 1
    return ids, mask, labels


def sft_loss(model: Any, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy on the labelled positions of left-padded rows (:func:`sft_rows`), with
    logits computed for the last positions only (the LM head over a 49k vocabulary dominates otherwise)."""
    keep = int((labels != -100).sum(1).max()) + 1
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=keep).logits
    target = labels[:, -keep + 1:]
    return torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), target.flatten(),
                                             ignore_index=-100)


def _lora(model: Any, rank: int) -> Any:
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets))


def train_lm_sft(cfg: LMWarmStartConfig, progress: bool = True, report: Callable[..., None] | None = None):
    """Run the warm-start recipe from the pretrained model; returns ``(model, tokenizer, info)`` (the model with
    any LoRA merged in, fp32, eval mode; ``info``: seconds, final loss, the loss curve)."""
    from oar.models import load_model_and_tokenizer

    torch.manual_seed(cfg.seed)
    model, tok = load_model_and_tokenizer(cfg.model)
    trained = _lora(model, cfg.lora_rank) if cfg.lora_rank else model
    trained.train()
    params = [p for p in trained.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)

    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.steps, cfg.warmup, cfg.min_lr_ratio))
    rng = random.Random(f"lm-sft:{cfg.seed}")
    losses: list[float] = []
    row = "warm start (SFT)"
    lines = ProgressLines({row: cfg.steps}, enabled=progress and report is None)
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        ids, mask, labels = sft_rows(tok, train_batch(rng, cfg.task, cfg.batch_size))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            loss = sft_loss(trained, ids, mask, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        lines.advance(row, loss=f"{losses[-1]:.3f}")
        if report is not None:
            report(step=step + 1, total=cfg.steps, done=(step + 1) / cfg.steps, note=f"loss {losses[-1]:.3f}")
    lines.close()
    if cfg.lora_rank:
        model = trained.merge_and_unload()
    info = {"seconds": time.perf_counter() - t0, "loss": losses[-1], "losses": losses[:: max(1, cfg.steps // 50)]}
    return model.eval(), tok, info


def lm_warm_start(cfg: LMWarmStartConfig, cache_dir: str | Path | None = None, progress: bool = True,
                  report: Callable[..., None] | None = None):
    """The warm-started LM: loaded from ``cache_dir/<cfg.key()>`` when cached, else trained and saved atomically
    there. Returns ``(model, tokenizer, path)``; the tokenizer pads on the left."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(cache_dir or oar_cache_dir("lab")) / cfg.key()
    if not (path / "info.json").exists():
        model, tok, info = train_lm_sft(cfg, progress, report)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{cfg.key()}."))
        try:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            (tmp / "info.json").write_text(json.dumps({"config": asdict(cfg), **info}, indent=1))
            replace_dir(tmp, path, keep_existing=True)  # another process cached it first: keep theirs
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    return model, tok, path
