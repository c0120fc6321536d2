"""Library noise that says nothing to an ``oar`` user, silenced only where ``oar`` triggers it.

``quiet_libraries()`` is a context manager, not a global filter: inside it the listed warnings are ignored and
transformers/datasets log errors only and draw no progress bars of their own (``oar`` draws one view instead);
leaving it restores every setting. ``verbose=True`` (``--verbose``) leaves everything as it is.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Iterator

# (category, message regex) of warnings the libraries raise on every oar run and that need no action from a user
NOISE: tuple[tuple[type[Warning], str], ...] = (
    (FutureWarning, r".*gradient_checkpointing.* is deprecated"),  # transformers 5 renames, raised by TRL itself
    (UserWarning, r".*`generation_config` default values have been modified"),
    (UserWarning, r".*does not support gradient checkpointing"),
)
# (logger, message regex) of log records dropped: DeepSpeed (imported by accelerate) announces a CPU machine
LOG_NOISE: tuple[tuple[str, str], ...] = (("DeepSpeed", r"Setting accelerator to CPU"),)


class _DropMessages(logging.Filter):
    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.match(record.getMessage())


@contextlib.contextmanager
def quiet_libraries(verbose: bool = False) -> Iterator[None]:
    """Silence :data:`NOISE`, :data:`LOG_NOISE`, transformers/datasets info logs and their progress bars inside
    the block."""
    if verbose:
        yield
        return
    from datasets.utils import logging as ds_logging
    from transformers.utils import logging as tf_logging

    tf_level, ds_level = tf_logging.get_verbosity(), ds_logging.get_verbosity()
    tf_bars, ds_bars = tf_logging.is_progress_bar_enabled(), ds_logging.is_progress_bar_enabled()
    filters = [(logging.getLogger(name), _DropMessages(pattern)) for name, pattern in LOG_NOISE]
    for logger, drop in filters:  # a filter on the logger outlives the level and handlers the library sets later
        logger.addFilter(drop)
    with warnings.catch_warnings():
        for category, message in NOISE:
            warnings.filterwarnings("ignore", message=message, category=category)
        tf_logging.set_verbosity_error()
        ds_logging.set_verbosity_error()
        tf_logging.disable_progress_bar()
        ds_logging.disable_progress_bar()
        try:
            yield
        finally:
            tf_logging.set_verbosity(tf_level)
            ds_logging.set_verbosity(ds_level)
            (tf_logging.enable_progress_bar if tf_bars else tf_logging.disable_progress_bar)()
            (ds_logging.enable_progress_bar if ds_bars else ds_logging.disable_progress_bar)()
            for logger, drop in filters:
                logger.removeFilter(drop)
