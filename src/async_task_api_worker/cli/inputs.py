"""What the commands read from people (JSON objects) and how they talk to them (log lines)."""

from __future__ import annotations

import json
import sys
from typing import IO

from pydantic import BaseModel

from async_task_api_worker.errors import TargetError
from async_task_api_worker.protocol.encoding import canonical_dumps
from async_task_api_worker.settings import LogFormat, WorkerSettings

__all__ = ["json_object", "readable", "report_line"]


def json_object(text: str, what: str) -> dict[str, object]:
    """``text`` read as a JSON object (a task input of ``dev`` and ``submit``, an input ref).

    Raises:
        TargetError: ``text`` is not JSON, or not an object; the message names ``what``.
    """
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise TargetError(f"{what} is not JSON: {exc}") from None
    except RecursionError:
        raise TargetError(f"{what} is nested too deep to read") from None
    if not isinstance(value, dict):
        raise TargetError(f"{what} must be a JSON object")
    return value


def readable(settings: WorkerSettings, stream: IO[str] | None = None) -> WorkerSettings:
    """The settings of a command a person may read on a terminal (``run``, ``dev``, ``submit``...).

    The one rule of the log format: when the stream the command logs to is a terminal
    (``stream``, default stderr, where most commands log: their stdout carries their output;
    ``run`` logs to stdout) the lines are text, unless ``LOG_FORMAT`` (or ``--log-format``) says
    otherwise; elsewhere (a container's log collector, a pipe) JSON, the setting's default.
    """
    stream = sys.stderr if stream is None else stream
    if "log_format" not in settings.model_fields_set and stream.isatty():
        return settings.model_copy(update={"log_format": LogFormat.TEXT})
    return settings


def report_line(report: BaseModel) -> str:
    """A report as ``submit`` and ``reports`` print it: its canonical JSON, on one line."""
    return canonical_dumps(report.model_dump()).decode("utf-8", "surrogateescape")
