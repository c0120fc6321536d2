"""OAR token credit in verl without a fork (``pip install oar-rl[verl]``).

verl imports :mod:`oar.integrations.verl.plugin` on ``import verl`` (entry point group ``verl.plugins``), which
registers the v1 trainer ``oar_sync``. Run with ``trainer.v1.trainer_mode=oar_sync`` and OAR's knobs in the
top-level ``oar:`` block (``+oar.credit=oar-g``); see docs/scaling.md. :mod:`.core` holds the framework-free
pieces (pure torch), :mod:`.trainer` the verl classes.
"""
