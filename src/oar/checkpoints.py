"""Checkpoints of ``OARGRPOTrainer``: atomic (staged, then renamed into place) and carrying OAR's own state;
rotation that never leaves half a checkpoint; the checkpoint a resume continues from (damaged ones named and
passed over) and the crash-safe final save.

A checkpoint is written into ``OUTPUT_DIR/.checkpoint-staging/checkpoint-N`` and renamed to
``OUTPUT_DIR/checkpoint-N`` once every rank has written its files, so a ``checkpoint-N`` directory is never
half-written; rotation (``save_total_limit``) renames a checkpoint to ``.trash-checkpoint-N`` before deleting
it, so it is never half-deleted either. Next to TRL's files each rank stores ``oar_state_{rank}.pth``: the
state of the generator the OAR-G noise and the random baseline draw from, and the rollout-batch counter that
paces ``oar_dump_every``, so a resumed run draws exactly what the uninterrupted run would have drawn.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from oar.files import replace_dir

# no "checkpoint-" prefix: transformers' rotation and resume never see it
STAGING_DIR = ".checkpoint-staging"
FINAL_STAGING = ".model-staging"  # where the final model is saved before it is renamed into OUTPUT_DIR
TRASH_PREFIX = ".trash-"  # a checkpoint being deleted by rotation: renamed first, so resume never sees it
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
OAR_STATE = "oar_state_{rank}.pth"

logger = logging.getLogger(__name__)


def save_oar_state(state: Any, checkpoint_dir: str, rank: int) -> None:
    """Rank ``rank``'s ``oar_state_{rank}.pth``: ``state.state_dict()`` (the trainer's ``OARState``: scorer
    generator state and rollout counter)."""
    torch.save(state.state_dict(), os.path.join(checkpoint_dir, OAR_STATE.format(rank=rank)))


def load_oar_state(state: Any, checkpoint_dir: str, rank: int) -> None:
    """Restore what :func:`save_oar_state` wrote into ``state`` (``load_state_dict``); a checkpoint without it
    (an older oar) only warns."""
    path = os.path.join(checkpoint_dir, OAR_STATE.format(rank=rank))
    if not os.path.isfile(path):
        logger.warning("%s has no %s: the OAR scorer's random draws will not repeat the interrupted run's",
                       checkpoint_dir, os.path.basename(path))
        return
    state.load_state_dict(torch.load(path, weights_only=True))


def save_atomic(trainer: Any, trial: Any, save: Callable[[], None]) -> None:
    """Run ``save`` (TRL's ``_save_checkpoint`` with the trainer's output dir pointing into the staging dir: the
    trainer redirects it while ``save`` runs), then rename the finished ``checkpoint-N`` into place and rotate
    (``save_total_limit``)."""
    run_dir = trainer._get_output_dir(trial)
    staging = os.path.join(run_dir, STAGING_DIR)
    name = f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"
    if trainer.args.should_save:
        shutil.rmtree(staging, ignore_errors=True)  # what an interrupted save left
    trainer.accelerator.wait_for_everyone()
    save()  # rotates inside the staging dir: a no-op
    trainer.accelerator.wait_for_everyone()  # every rank has written its files (e.g. its RNG state)
    target = os.path.join(run_dir, name)
    staged_best = trainer.state.best_model_checkpoint == os.path.join(staging, name)
    if staged_best:
        trainer.state.best_model_checkpoint = target
    if not trainer.args.should_save:
        return
    if staged_best:
        trainer.state.save_to_json(os.path.join(staging, name, TRAINER_STATE_NAME))
    replace_dir(os.path.join(staging, name), target)  # a checkpoint-N of an earlier, interrupted run is replaced
    shutil.rmtree(staging)
    rotate(trainer, run_dir)


def rotate(trainer: Any, run_dir: str) -> None:
    """transformers' ``save_total_limit`` rotation of ``run_dir`` (``transformers.trainer_utils.rotate_checkpoints``:
    the oldest go first, by modification time and then step; the newest and the best checkpoint are kept), except
    that each checkpoint is renamed to ``.trash-checkpoint-N`` before it is deleted (:func:`discard`): a kill
    mid-rotation leaves a whole ``checkpoint-N`` or a trash directory that resume ignores, never half of one."""
    clear_trash(run_dir)
    limit = trainer.args.save_total_limit
    if limit is None or limit <= 0:
        return
    ordered = [p for _, _, p in sorted((p.stat().st_mtime, n, p) for n, p in checkpoint_dirs(run_dir))]
    if len(ordered) <= limit:
        return
    best = trainer.state.best_model_checkpoint
    protected = {ordered[-1]} | ({Path(best)} if best else set())
    remaining = len(ordered)
    for path in ordered:
        if remaining <= max(limit, len(protected)):
            break
        if path not in protected:
            discard(path)
            remaining -= 1


def discard(path: str | os.PathLike) -> None:
    """Delete the directory ``path`` by renaming it to ``.trash-NAME`` in its parent first, then deleting that."""
    path = Path(path)
    trash = path.parent / f"{TRASH_PREFIX}{path.name}"
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def clear_trash(run_dir: str | os.PathLike) -> None:
    """Delete what an interrupted :func:`discard` left in ``run_dir``."""
    for path in Path(run_dir).glob(f"{TRASH_PREFIX}*"):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def checkpoint_dirs(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(N, path)`` of every ``checkpoint-N`` directory in ``output_dir``, by N; a symbolic link is not one of
    this run's checkpoints (it may point into another run) and is left out."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in out.iterdir()
                  if (m := _CHECKPOINT.match(p.name)) and p.is_dir() and not p.is_symlink())


def _state_problem(path: Path, step: int) -> str | None:
    """Why ``path`` is not a complete ``checkpoint-{step}`` by its ``trainer_state.json``, or None."""
    try:
        state = json.loads((path / TRAINER_STATE_NAME).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{TRAINER_STATE_NAME} is missing"
    except (OSError, ValueError) as err:
        return f"{TRAINER_STATE_NAME} is damaged ({_first_line(err)})"
    stored = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(stored, int) or isinstance(stored, bool):
        return f"{TRAINER_STATE_NAME} holds no global_step"
    if stored != step:
        return f"its {TRAINER_STATE_NAME} is of step {stored}, not {step}"
    return None


def last_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The highest ``checkpoint-N`` in ``output_dir`` whose ``trainer_state.json`` is complete and of step N, else
    None (symbolic links left out). Reads no other file; :func:`resume_checkpoint` checks them all.

    ``OARGRPOTrainer`` renames a checkpoint into place only once complete; for one written in place by another
    Trainer, which writes ``trainer_state.json`` last, a checkpoint interrupted mid-save is skipped too.
    """
    for step, path in reversed(checkpoint_dirs(output_dir)):
        if _state_problem(path, step) is None:
            return str(path)
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _load_torch(path: Path, mmap: bool = False) -> Any:
    """``torch.load`` as transformers' resume does it (weights only; numpy's RNG state allowed); ``mmap``: map
    the tensors instead of reading them (an optimizer state can be twice the model)."""
    try:
        from transformers.trainer_pt_utils import safe_globals
    except ImportError:  # transformers 5.0 keeps it in trainer.py
        from transformers.trainer import safe_globals
    with safe_globals():
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def _check_safetensors(path: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:  # the header is checked against the file's length
        f.keys()


# files and directories of an FSDP or DeepSpeed checkpoint (weights and optimizer state in their own layout)
_SHARDED = re.compile(r"^(pytorch_model_fsdp|optimizer_\d|optimizer\.bin$|global_step\d)")
# the weight files a checkpoint may hold (the first found is checked): one file, a sharded index, a PEFT adapter
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin",
            "pytorch_model.bin.index.json", "adapter_model.bin")


def _file_problem(path: Path, needs_training_state: bool = True) -> str | None:
    """The first damaged or missing file of the checkpoint directory ``path`` (``NAME: why``), or None.

    Each file is read as resume reads it (safetensors' header against the file's length, ``torch.load`` with
    ``weights_only``, tensors mapped rather than read); a flipped bit inside a tensor goes unnoticed, as on resume
    (neither format keeps a checksum that resume checks). ``needs_training_state``: ``optimizer.pt``,
    ``scheduler.pt`` and an RNG state must be there (transformers would silently start them afresh), unless the
    checkpoint is laid out by FSDP or DeepSpeed, whose libraries load their own files."""
    layout_dirs = any(_SHARDED.match(p.name) for p in path.iterdir())
    weights = next((path / w for w in _WEIGHTS if (path / w).is_file()), None)
    checks: list[tuple[Path, Callable[[Path], Any]]] = []
    if weights is None:
        if not layout_dirs:
            return "has no model weights (model.safetensors or another weight file)"
    elif weights.name.endswith(".index.json"):
        try:
            shards = sorted(set(json.loads(weights.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            return f"{weights.name} is damaged ({_first_line(err)})"
        loader = _check_safetensors if weights.name.startswith("model.safetensors") else _load_torch
        checks += [(path / shard, loader) for shard in shards]
    else:
        checks.append((weights, _check_safetensors if weights.suffix == ".safetensors" else
                       lambda p: _load_torch(p, mmap=True)))
    training = [("optimizer.pt", lambda p: _load_torch(p, mmap=True)), ("scheduler.pt", _load_torch)]
    rng = sorted(path.glob("rng_state*.pth"))
    if needs_training_state and not layout_dirs:
        missing = [name for name, _ in training if not (path / name).is_file()] + ["rng_state.pth"] * (not rng)
        if missing:
            return f"{missing[0]} is missing"
    checks += [(path / name, loader) for name, loader in training if (path / name).is_file()]
    checks += [(p, _load_torch) for p in rng]
    checks += [(p, _load_torch) for p in sorted(path.glob(OAR_STATE.format(rank="*")))]
    for file, loader in checks:
        if not file.is_file():
            return f"{file.name} is missing"
        try:
            state = loader(file)
        except Exception as err:  # any reader's error: the file cannot be resumed from
            return f"{file.name} is damaged ({_first_line(err)})"
        if file.name.startswith("oar_state_") and not (
                isinstance(state, dict) and isinstance(state.get("generator"), torch.Tensor)
                and isinstance(state.get("rollouts"), int)):
            return f"{file.name} is not an OAR state (a dict with 'generator' and 'rollouts')"
    return None


def resume_checkpoint(output_dir: str | os.PathLike, needs_training_state: bool = True) -> str | None:
    """The checkpoint ``--resume`` continues from: the highest ``checkpoint-N`` whose ``trainer_state.json`` is of
    step N and whose files are intact (:func:`_file_problem`); None when ``output_dir`` holds no checkpoint.

    Every newer ``checkpoint-N`` passed over is named on stderr with what is wrong (a damaged or missing file, a
    symbolic link, which may point into another run); ValueError naming them all when none is usable.
    ``needs_training_state``: see :func:`_file_problem` (False with ``save_only_model``). First deletes what an
    interrupted rotation left (:func:`clear_trash`)."""
    out = Path(output_dir)
    clear_trash(out)
    passed = [(int(m.group(1)), f"{p} is a symbolic link (to {os.readlink(p)}), not a checkpoint of this run")
              for p in (out.iterdir() if out.is_dir() else ()) if (m := _CHECKPOINT.match(p.name)) and p.is_symlink()]
    for step, path in reversed(checkpoint_dirs(out)):
        problem = _state_problem(path, step) or _file_problem(path, needs_training_state)
        if problem is None:
            for _, why in sorted(p for p in passed if p[0] > step):
                print(f"oar: {why}; resuming from {path.name}", file=sys.stderr)
            return str(path)
        passed.append((step, f"{path}: {problem}"))
    if passed:
        raise ValueError(f"cannot resume from {str(out)!r}: {'; '.join(why for _, why in sorted(passed))}; no earlier "
                         "complete checkpoint to fall back to (move these away to start the run again)")
    return None


def checkpoint_step(checkpoint: str | os.PathLike) -> int:
    """``global_step`` of a complete checkpoint (from its ``trainer_state.json``)."""
    return int(json.loads((Path(checkpoint) / "trainer_state.json").read_text(encoding="utf-8"))["global_step"])


def save_final_model(trainer: Any, output_dir: str | os.PathLike) -> None:
    """``trainer.save_model(output_dir)``, crash-safe: every process saves into ``output_dir/.model-staging/``;
    once all files are written the main process renames each into ``output_dir`` (``os.replace``), so an
    interrupted save never leaves a truncated weight file. Pushes to the hub afterwards if ``args.push_to_hub``."""
    out = Path(output_dir)
    staging = out / FINAL_STAGING
    if trainer.is_world_process_zero():
        shutil.rmtree(staging, ignore_errors=True)  # what an interrupted save left
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(staging), _internal_call=True)  # every rank (gathers sharded weights)
    trainer.accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        for item in sorted(staging.iterdir()):
            if item.is_dir():
                replace_dir(item, out / item.name)
            else:
                os.replace(item, out / item.name)
        staging.rmdir()
    trainer.accelerator.wait_for_everyone()
    if trainer.args.push_to_hub:
        trainer.push_to_hub(commit_message="Final model")
