"""verl entry point (group ``verl.plugins``): importing this module registers the ``oar_sync`` trainer.

verl logs a failing plugin import at DEBUG only, which would surface later as an unknown trainer; this module
logs the failure itself at ERROR (with the traceback) and the success at WARNING, so both are visible.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("oar.integrations.verl")


def register() -> None:
    """Import :mod:`oar.integrations.verl.trainer` (its decorator registers the trainer) and say so loudly."""
    try:
        from oar.integrations.verl.trainer import TRAINER_NAME
    except Exception:
        logger.exception("oar verl plugin: registering the 'oar_sync' trainer FAILED; "
                         "trainer.v1.trainer_mode=oar_sync will be unknown to verl")
        raise
    logger.warning("oar verl plugin: registered trainer %r (select with trainer.v1.trainer_mode=%s, "
                   "OAR knobs in the +oar.* config block)", TRAINER_NAME, TRAINER_NAME)


register()
