"""The SDK's log set-up: one line per record, added only if the application configured none."""

from __future__ import annotations

import logging
import sys

__all__ = ["configure_logging"]

_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def configure_logging(level: str) -> None:
    """Send the SDK's records to stderr at ``level``, unless the root logger has handlers.

    An application that configured logging before running the worker keeps its own handlers
    and format; the SDK then only sets its own logger's level.
    """
    logging.getLogger("async_task_api_worker").setLevel(level)
    root = logging.getLogger()
    if root.handlers:
        return
    # The broker client narrates every reconnect at INFO; the SDK says what matters itself.
    for chatty in ("aio_pika", "aiormq"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLevelName(level)))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    root.addHandler(handler)
    root.setLevel(level)
