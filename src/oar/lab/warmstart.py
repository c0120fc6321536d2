"""Supervised warm start of the lab model, cached on disk under a hash of its configuration."""

from __future__ import annotations

import hashlib
import json
import math
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from oar.cache import cache_dir as oar_cache_dir
from oar.files import replace_dir
from oar.lab.model import ModelConfig, build_model, lab_tokenizer
from oar.lab.task import LabProblem, TaskConfig, is_test_prompt, make_problem
from oar.progress import ProgressLines

CACHE_VERSION = 1


@dataclass(frozen=True)
class WarmStartConfig:
    """SFT recipe: ``steps`` AdamW steps of ``batch_size`` fresh train problems (test prompts excluded),
    linear warm-up then cosine decay to ``min_lr_ratio * lr``; loss on completion tokens only."""

    task: TaskConfig = field(default_factory=lambda: TaskConfig(slip_rate=0.2))
    model: ModelConfig = field(default_factory=ModelConfig)
    steps: int = 800
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    seed: int = 0

    def key(self) -> str:
        blob = json.dumps({"v": CACHE_VERSION, **asdict(self), "task": self.task.key_fields()}, sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]


def sft_batch(tokenizer, problems, device="cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids, attention_mask, labels [B, L]`` (labels -100 except completion + eos)."""
    rows, labs = [], []
    for p in problems:
        prompt = tokenizer(p.prompt)["input_ids"]
        comp = tokenizer(p.completion)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt + comp)
        labs.append([-100] * len(prompt) + comp)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (r, lab) in enumerate(zip(rows, labs, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(lab)] = torch.tensor(lab)
    mask = (labels != -100) | (ids != tokenizer.pad_token_id)
    return ids.to(device), mask.to(device), labels.to(device)


def warmup_cosine(steps: int, warmup: int, min_lr_ratio: float) -> Callable[[int], float]:
    """The SFT learning-rate factor per step: linear warm-up over ``warmup`` steps, then cosine down to
    ``min_lr_ratio`` at ``steps`` (for ``torch.optim.lr_scheduler.LambdaLR``)."""

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(steps - warmup, 1)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    return lr_at


def train_batch(rng: random.Random, task: TaskConfig, batch_size: int) -> list[LabProblem]:
    """``batch_size`` fresh problems of ``task`` drawn from ``rng``, none with a held-out prompt."""
    batch = []
    while len(batch) < batch_size:
        p = make_problem(rng, task)
        if not is_test_prompt(p.prompt):
            batch.append(p)
    return batch


def train_sft(cfg: WarmStartConfig, progress: bool = True, report: Callable[..., None] | None = None):
    """Run the SFT recipe from scratch; returns ``(model, tokenizer, info)`` with the loss curve in ``info``.

    Progress: ``report(step=, total=, done=, note=)`` after every step when given, else a step line when
    ``progress``."""
    tok = lab_tokenizer()
    model = build_model(cfg.model, len(tok), seed=cfg.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)

    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.steps, cfg.warmup, cfg.min_lr_ratio))
    rng = random.Random(f"sft:{cfg.seed}")
    losses = []
    t0 = time.perf_counter()
    lines = ProgressLines({"warm start (SFT)": cfg.steps}, enabled=progress and report is None)
    for step in range(cfg.steps):
        ids, mask, labels = sft_batch(tok, train_batch(rng, cfg.task, cfg.batch_size))
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        lines.advance("warm start (SFT)", loss=f"{losses[-1]:.3f}")
        if report is not None:
            report(step=step + 1, total=cfg.steps, done=(step + 1) / cfg.steps, note=f"loss {losses[-1]:.3f}")
    lines.close()
    model.eval()
    info = {"seconds": time.perf_counter() - t0, "loss": losses[-1], "losses": losses[:: max(1, cfg.steps // 50)]}
    return model, tok, info


def cache_entry(cfg: WarmStartConfig, cache_dir: str | Path | None = None) -> Path:
    """Where the warm start of ``cfg`` is cached: ``cache_dir/<cfg.key()>`` (default ``oar.cache``'s ``lab``)."""
    return Path(cache_dir or oar_cache_dir("lab")) / cfg.key()


def _store(path: Path, write: Callable[[Path], None]) -> None:
    """Make the cache entry ``path`` by ``write(staging_dir)``, atomically; another process's entry is kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    write(tmp)
    replace_dir(tmp, path, keep_existing=True)  # another process cached it first: keep theirs


def warm_start(cfg: WarmStartConfig | None = None, cache_dir: str | Path | None = None, progress: bool = True,
               report: Callable[..., None] | None = None):
    """The warm-started lab model: loaded from ``cache_dir/<cfg.key()>`` when cached, else trained and saved
    atomically there (progress as in :func:`train_sft`). Returns ``(model, tokenizer, path)``."""
    from transformers import Qwen2ForCausalLM

    cfg = cfg or WarmStartConfig()
    path = cache_entry(cfg, cache_dir)
    if not (path / "info.json").exists():
        model, _, info = train_sft(cfg, progress, report)

        def write(tmp: Path) -> None:
            model.save_pretrained(tmp)
            (tmp / "info.json").write_text(json.dumps({"config": asdict(cfg), **info}, indent=1))

        _store(path, write)
    model = Qwen2ForCausalLM.from_pretrained(path).float().eval()
    return model, lab_tokenizer(), path


def cached_files(path: str | Path) -> dict[str, bytes]:
    """The files of the cache entry ``path`` (weights, config, ``info.json``: 1.2 MB for the default model), by
    relative path, to install the same warm start on another machine (:func:`install_warm_start`;
    ``oar compare --backend ray``)."""
    root = Path(path)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def install_warm_start(cfg: WarmStartConfig, files: dict[str, bytes], cache_dir: str | Path | None = None) -> Path:
    """Put ``files`` (:func:`cached_files` of ``cfg``'s warm start) into this machine's cache unless it holds
    the entry already; returns its path. :func:`warm_start` then loads it instead of training it again."""
    path = cache_entry(cfg, cache_dir)

    def write(tmp: Path) -> None:
        for name, data in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(data)

    if not (path / "info.json").exists():
        _store(path, write)
    return path
