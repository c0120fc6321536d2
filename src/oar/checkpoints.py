"""Checkpoints of ``OARGRPOTrainer``: atomic (staged, then renamed into place) and carrying OAR's own state;
finding the last complete one (resume) and the crash-safe final save.

A checkpoint is written into ``OUTPUT_DIR/.checkpoint-staging/checkpoint-N`` and renamed to
``OUTPUT_DIR/checkpoint-N`` once every rank has written its files, so a ``checkpoint-N`` directory is never
half-written. Next to TRL's files each rank stores ``oar_state_{rank}.pth``: the state of the generator the
OAR-G noise and the random baseline draw from, and the rollout-batch counter that paces ``oar_dump_every``,
so a resumed run draws exactly what the uninterrupted run would have drawn.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
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
    """transformers' ``save_total_limit`` rotation of ``run_dir``."""
    from transformers import trainer_utils

    if not hasattr(trainer_utils, "rotate_checkpoints"):  # older transformers (5.0): a Trainer method
        trainer._rotate_checkpoints(use_mtime=True, output_dir=run_dir)
        return
    trainer_utils.rotate_checkpoints(
        output_dir=run_dir, save_total_limit=trainer.args.save_total_limit,
        best_model_checkpoint=trainer.state.best_model_checkpoint, use_mtime=True,
    )


def last_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The highest ``checkpoint-N`` in ``output_dir`` whose ``trainer_state.json`` is complete, else None.

    ``OARGRPOTrainer`` renames a checkpoint into place only once complete; for one written in place by another
    Trainer, which writes ``trainer_state.json`` last, a checkpoint interrupted mid-save is skipped too.
    """
    out = Path(output_dir)
    if not out.is_dir():
        return None
    steps = sorted(
        (int(m.group(1)), p) for p in out.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))
    )
    for _, path in reversed(steps):
        try:
            json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        return str(path)
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
