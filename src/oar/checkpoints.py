"""Checkpoints of ``OARGRPOTrainer``: atomic (staged, then renamed into place) and carrying OAR's own state.

A checkpoint is written into ``OUTPUT_DIR/.checkpoint-staging/checkpoint-N`` and renamed to
``OUTPUT_DIR/checkpoint-N`` once every rank has written its files, so a ``checkpoint-N`` directory is never
half-written. Next to TRL's files each rank stores ``oar_state_{rank}.pth``: the state of the generator the
OAR-G noise and the random baseline draw from, and the rollout-batch counter that paces ``oar_dump_every``,
so a resumed run draws exactly what the uninterrupted run would have drawn.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from typing import Any

import torch
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from oar.files import replace_dir

# no "checkpoint-" prefix: transformers' rotation and resume never see it
STAGING_DIR = ".checkpoint-staging"
OAR_STATE = "oar_state_{rank}.pth"

logger = logging.getLogger(__name__)


def save_oar_state(trainer: Any, checkpoint_dir: str) -> None:
    """This rank's ``oar_state_{rank}.pth``: scorer generator state and rollout counter."""
    state = {"generator": trainer._oar_generator.get_state(), "rollouts": int(trainer._oar_rollouts)}
    torch.save(state, os.path.join(checkpoint_dir, OAR_STATE.format(rank=trainer.accelerator.process_index)))


def load_oar_state(trainer: Any, checkpoint_dir: str) -> None:
    """Restore what :func:`save_oar_state` wrote; a checkpoint without it (an older oar) only warns."""
    path = os.path.join(checkpoint_dir, OAR_STATE.format(rank=trainer.accelerator.process_index))
    if not os.path.isfile(path):
        logger.warning("%s has no %s: the OAR scorer's random draws will not repeat the interrupted run's",
                       checkpoint_dir, os.path.basename(path))
        return
    state = torch.load(path, weights_only=True)
    trainer._oar_generator.set_state(state["generator"])
    trainer._oar_rollouts = int(state["rollouts"])


def save_atomic(trainer: Any, trial: Any, save: Callable[[], None]) -> None:
    """Run ``save`` (TRL's ``_save_checkpoint``) with the trainer's output dir pointing into the staging dir,
    then rename the finished ``checkpoint-N`` into place and rotate (``save_total_limit``)."""
    run_dir = trainer._get_output_dir(trial)
    staging = os.path.join(run_dir, STAGING_DIR)
    name = f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"
    if trainer.args.should_save:
        shutil.rmtree(staging, ignore_errors=True)  # what an interrupted save left
    trainer.accelerator.wait_for_everyone()
    trainer._oar_staging = True
    try:
        save()  # rotates inside the staging dir: a no-op
    finally:
        trainer._oar_staging = False
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
