"""Loading ``module:attribute`` into a Worker (kept where the commands look for it)."""

from __future__ import annotations

import logging
from typing import IO

from async_task_api_worker.definition import Worker
from async_task_api_worker.errors import ConfigError
from async_task_api_worker.observability.logging import configure_logging
from async_task_api_worker.runtime.entry import check_worker
from async_task_api_worker.settings import LogLevel, WorkerSettings
from async_task_api_worker.targets import load_worker

__all__ = ["load_target", "load_worker"]

_logger = logging.getLogger("async_task_api_worker.cli")


def load_target(target: str, settings: WorkerSettings, *, stream: IO[str] | None = None) -> Worker:
    """:func:`load_worker` checked against ``settings``; at DEBUG, the traceback of a failure.

    What every command does before anything else: the settings are loaded first (their log
    level says whether the traceback is shown), then the target, then the worker is checked
    against the settings (``runtime.entry.check_worker``: the time budget, the event loop).

    The one-line error stays the command's (exit 2); at DEBUG a log line on ``stream`` (default
    stdout) comes first, in ``LOG_FORMAT``, with the whole traceback of what the module raised
    (messages included: the one line names the first already; URL passwords are masked).

    Raises:
        TargetError: as :func:`load_worker`.
        DefinitionError: as :func:`load_worker`.
        SettingsError: the worker does not fit the settings (``check_worker``).
    """
    try:
        worker = load_worker(target)
    except ConfigError as exc:
        if settings.log_level is LogLevel.DEBUG:
            # Logging is set up after the import (the module may set up its own): not yet here.
            configure_logging(settings.log_level, log_format=settings.log_format, stream=stream)
            _logger.debug("Loading %s failed", target, exc_info=exc)
        raise
    check_worker(worker, settings)
    return worker
