"""One lab training run: the warm-started model trained by ``OARGRPOTrainer`` under a budget of training
seconds, with held-out sampled accuracy evaluated along the way; writes the shared run-directory format."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from oar.files import atomic_write
from oar.lab.lm import LMWarmStartConfig, chat_prompt, lm_warm_start
from oar.lab.model import accuracy
from oar.lab.task import BOXED, TaskConfig, lab_reward, make_split, max_completion_chars
from oar.lab.warmstart import WarmStartConfig, warm_start
from oar.ranges import check_finite_fields
from oar.rundir import RunDir
from oar.rundir_callback import RunDirCallback

# how a lab run counts its training seconds (RunConfig.clock)
# "cpu" is the training thread's own CPU time: the callbacks run on the thread that trains (torch at one thread),
# and a progress thread or a queue feeder in the same process is not charged to the run
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}


@dataclass(frozen=True)
class RunConfig:
    """RL recipe of one lab run (the tuned defaults; docs/studies/first-study has what was tried).

    ``credit``: the credit and its options in one value, ``NAME`` or ``NAME@OPT=VALUE&...``
    (:class:`oar.credit.CreditSpec`; checked here, stored as its canonical text).

    ``budget_s``: training seconds (evaluation excluded) after which the run stops; ``max_steps`` caps it too.
    ``clock``: how training seconds are counted: ``"cpu"``, the CPU time of the thread that trains (one torch thread, so
    equal to wall-clock time on an idle core, and unchanged when other jobs share the machine), or ``"wall"``.
    ``eval_problems`` held-out problems × ``eval_k`` samples at ``temperature`` give ``eval/accuracy``.
    ``max_completion_length`` (tokens) defaults to room for the task's longest worked solution.
    ``freeze_embeddings``: keep the input embeddings fixed during RL (with a tied head this freezes it too).
    ``save_model``: also write the final weights to ``run_dir/model.pt`` (a ``state_dict``; load it into the warm
    start's model).
    ``gradient_checkpointing``: off (TRL turns it on by default; a 0.25 M-parameter model does not need it, and
    a GRPO step takes 0.97 s instead of 1.10 s without it, docs/studies/first-study).
    ``warm``: the character lab's warm start, or the language-model lab's (:class:`oar.lab.lm.LMWarmStartConfig`:
    SmolLM2 in its chat template, trained in the numerics of its ``bf16`` field: bf16 autocast over fp32 weights with
    rollouts and evaluation sampled from a bf16 copy of the policy, :class:`oar.sampling.RolloutCopy`, or fp32).
    """

    credit: str = "grpo"
    seed: int = 0
    warm: WarmStartConfig | LMWarmStartConfig = field(default_factory=WarmStartConfig)
    prompts_per_step: int = 16
    group_size: int = 8
    temperature: float = 1.0
    lr: float = 1e-4
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    adam_beta2: float = 0.99
    loss_type: str = "dr_grpo"
    freeze_embeddings: bool = True
    gradient_checkpointing: bool = False
    save_model: bool = False
    max_completion_length: int | None = None  # None: the task's longest solution + 8 tokens
    budget_s: float = 120.0
    clock: str = "cpu"
    max_steps: int = 10_000
    eval_every: int = 20
    eval_problems: int = 256
    eval_k: int = 4
    train_pool: int = 20_000
    oar: dict = field(default_factory=dict)  # extra OARConfig fields (oar_batch_size, oar_max_probe_length, ...)

    def __post_init__(self) -> None:
        check_finite_fields(self)  # a NaN budget would never end a run; an infinite one only at max_steps
        from oar.credit import CreditSpec

        spec = CreditSpec.parse(self.credit)
        spec.resolve()  # ValueError naming an unknown credit, option or value, before any work
        object.__setattr__(self, "credit", str(spec))
        if not self.budget_s > 0:
            raise ValueError(f"budget_s must be > 0, got {self.budget_s}")
        if self.clock not in CLOCKS:
            raise ValueError(f"clock must be one of {tuple(CLOCKS)}, got {self.clock!r}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {self.eval_every}")


class LabCallback(RunDirCallback):
    """The run directory of :class:`oar.rundir_callback.RunDirCallback`, plus held-out evaluation every ``eval_every``
    steps (merged into that step's record; step 0 before training) and a stop once ``budget_s`` training seconds
    have passed. ``wall_time`` counts training seconds only (by ``clock``, a key of :data:`CLOCKS`);
    ``eval_time`` the evaluation seconds so far.
    ``report``: called with keywords ``step``, ``done`` (share of the budget used, 0..1) and ``s_per_step`` after
    every step, ``note`` when an evaluation starts and ``accuracy`` when it ends; ``oar compare`` draws them.
    """

    def __init__(self, run_info: dict, evaluate: Callable[[int], dict], budget_s: float, eval_every: int,
                 max_steps: int | None = None, report: Callable[..., None] | None = None,
                 clock: str = "cpu") -> None:
        super().__init__(run_info)
        self._evaluate, self.budget_s, self.eval_every = evaluate, budget_s, eval_every
        self.max_steps, self.report = max_steps, report or (lambda **fields: None)
        self.now = CLOCKS[clock]
        self.train_s = self.eval_s = 0.0
        self.t_step = 0.0
        self.pending: dict = {}

    def elapsed(self) -> float:
        return self.train_s

    def evaluate(self, step: int) -> dict:
        self.report(note=f"held-out evaluation at step {step}")
        t0 = self.now()
        out = {f"eval/{k}": v for k, v in self._evaluate(step).items()}
        self.eval_s += self.now() - t0
        self.report(step=step, accuracy=out.get("eval/accuracy"), note="")
        return out

    def on_train_begin(self, args, state, control, **kw):
        super().on_train_begin(args, state, control, **kw)
        self.append(args, {"step": 0, "wall_time": 0.0, **self.evaluate(0), "eval_time": round(self.eval_s, 3)})

    def on_step_begin(self, args, state, control, **kw):
        self.t_step = self.now()

    def on_step_end(self, args, state, control, **kw):
        self.train_s += self.now() - self.t_step
        if self.train_s >= self.budget_s:
            control.should_training_stop = True
        step = state.global_step
        self.report(step=step, s_per_step=self.train_s / max(step, 1),
                    done=max(self.train_s / self.budget_s, step / self.max_steps if self.max_steps else 0.0))
        if state.global_step % self.eval_every == 0 or control.should_training_stop:
            self.pending.update(self.evaluate(state.global_step))

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "train_runtime" not in logs:
            logs = {**logs, **self.pending, "eval_time": round(self.eval_s, 3)}
            self.pending = {}
        super().on_log(args, state, control, logs=logs, **kw)


def credit_defaults(cfg: RunConfig) -> dict:
    """The registered option defaults of ``cfg.credit``'s method as JSON types (recorded in run.json)."""
    from oar.credit import CreditSpec, get_credit

    return json.loads(json.dumps(dict(get_credit(CreditSpec.parse(cfg.credit).name).options)))


def start_eval_path(warm_path: Path, task: TaskConfig, cfg: RunConfig, max_new_tokens: int, batch_size: int,
                    rollout_dtype: str | None) -> Path:
    """Where the step-0 evaluation of a warm start is cached: ``<cache>/start-eval/<warm start>-<digest>.json``.

    Every run from one warm start evaluates the same weights on the same problems with the same seeds (the sampler
    draws from its own generator, so skipping it leaves training's random stream as it was), so the first run
    stores the result and the others read it. The digest covers what the evaluation reads: the warm start's files
    (names, sizes, modification times: a rebuilt warm start is a new entry), the held-out split, ``k``, temperature,
    length, batch size, the sampler's dtype, and the source of the sampling code."""
    import hashlib

    from oar import sampling
    from oar.lab import model as lab_model

    files = sorted((p.relative_to(warm_path).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                   for p in warm_path.rglob("*") if p.is_file())
    key = json.dumps({"warm": files, "task": task.key(), "eval_problems": cfg.eval_problems, "eval_k": cfg.eval_k,
                      "temperature": cfg.temperature, "max_new_tokens": max_new_tokens, "batch_size": batch_size,
                      "rollout_dtype": rollout_dtype,
                      "code": [Path(m.__file__).read_text() for m in (sampling, lab_model)]}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return warm_path.parent / "start-eval" / f"{warm_path.name}-{digest}.json"


def train_lab(cfg: RunConfig, run_dir: str | Path, cache_dir: str | Path | None = None,
              report: Callable[..., None] | None = None) -> dict:
    """Train one (credit, seed) run into ``run_dir`` (run.json, metrics.jsonl, summary.json); returns the summary.

    Uses ``oar.trainer.OARGRPOTrainer`` (``credit="grpo"`` is TRL's GRPO). One torch thread. ``report``: the
    progress hook of :class:`LabCallback` (keyword fields ``step``, ``done``, ``s_per_step``, ``accuracy``).
    """
    from datasets import Dataset
    from transformers import PrinterCallback

    from oar.trainer import OARConfig, OARGRPOTrainer

    torch.set_num_threads(1)
    run = RunDir(run_dir)
    run.path.mkdir(parents=True, exist_ok=True)
    run.metrics_jsonl.unlink(missing_ok=True)
    lm = isinstance(cfg.warm, LMWarmStartConfig)
    model, tok, warm_path = (lm_warm_start if lm else warm_start)(cfg.warm, cache_dir, progress=False)
    if cfg.freeze_embeddings:  # RL moves the blocks and the head; input embeddings stay as SFT left them
        model.get_input_embeddings().weight.requires_grad_(False)
    task = replace(cfg.warm.task, slip_rate=0.0)
    max_len = cfg.max_completion_length or max_completion_chars(task) + 8  # chars >= tokens for a BPE model
    train = make_split(task, "train", cfg.train_pool, seed=cfg.seed)
    test = make_split(task, "test", cfg.eval_problems, seed=0)
    if lm:  # the user turn of the chat template (TRL applies it to message prompts)
        ds = Dataset.from_list([{"prompt": [{"role": "user", "content": p.prompt}], "answer": p.answer}
                                for p in train])
        test_prompts = [chat_prompt(tok, p.prompt) for p in test]
    else:
        ds = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in train])
        test_prompts = None
    args = OARConfig(
        output_dir=str(run.path), credit=cfg.credit, seed=cfg.seed, use_cpu=True, bf16=lm and cfg.warm.bf16,
        oar_rollout_dtype="bfloat16" if lm and cfg.warm.bf16 else None,
        per_device_train_batch_size=cfg.prompts_per_step * cfg.group_size, num_generations=cfg.group_size,
        max_completion_length=max_len, temperature=cfg.temperature, top_k=0, top_p=1.0,
        learning_rate=cfg.lr, lr_scheduler_type="constant_with_warmup", warmup_steps=cfg.warmup_steps,
        max_grad_norm=cfg.max_grad_norm, adam_beta2=cfg.adam_beta2, beta=0.0, loss_type=cfg.loss_type,
        gradient_checkpointing=cfg.gradient_checkpointing, max_steps=cfg.max_steps, logging_steps=1,
        save_strategy="no", report_to="none",
        disable_tqdm=True, dataloader_num_workers=0, conclude_text=BOXED, **cfg.oar,
    )
    # the credit's registered option defaults: a resumed comparison must not reuse a run made under other defaults
    trainer = None

    eval_batch = 128 if lm else 512
    start_cache = start_eval_path(warm_path, task, cfg, max_len, eval_batch, args.oar_rollout_dtype)

    def evaluate(step: int) -> dict:
        if step == 0 and start_cache.exists():  # the warm start's own evaluation: the same for every run from it
            return json.loads(start_cache.read_text())
        sampler = model
        if trainer is not None and trainer._rollout_copy is not None:  # the LM lab samples from the bf16 copy
            trainer._rollout_copy.sync(model)
            sampler = trainer._rollout_copy.model
        out = accuracy(sampler, tok, test, k=cfg.eval_k, temperature=cfg.temperature, max_new_tokens=max_len,
                       seed=1000 + step, prompts=test_prompts, batch_size=eval_batch)
        if step == 0:
            start_cache.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(start_cache, json.dumps(out))
        return out

    cb = LabCallback({"model": f"lab:{warm_path.name}", "lab": asdict(cfg), "credit_defaults": credit_defaults(cfg)},
                     evaluate, cfg.budget_s, cfg.eval_every, cfg.max_steps, report, cfg.clock)
    trainer = OARGRPOTrainer(model=model, args=args, processing_class=tok, reward_funcs=lab_reward,
                             train_dataset=ds, callbacks=[cb])
    trainer.remove_callback(PrinterCallback)
    t0 = time.perf_counter()
    trainer.train()
    if cfg.save_model:
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        atomic_write(run.path / "model.pt", buf.getvalue())
    evals = [r for r in run.metrics() if "eval/accuracy" in r]
    summary = {
        "credit": cfg.credit, "seed": cfg.seed, "steps": trainer.state.global_step,
        "train_seconds": cb.train_s, "eval_seconds": cb.eval_s, "wall_seconds": time.perf_counter() - t0,
        "start": evals[0], "final": evals[-1],
    }
    atomic_write(run.summary_json, json.dumps(summary, indent=1))
    return summary
