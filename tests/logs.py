"""Log capture for the tests: a handler on a logger, at a level, for a ``with`` block."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def attached(logger: logging.Logger, handler: logging.Handler, level: int) -> Iterator[None]:
    """``handler`` on ``logger``, which lets ``level`` and above through, until the block ends;
    the logger's level is put back after."""
    before = logger.level
    logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
