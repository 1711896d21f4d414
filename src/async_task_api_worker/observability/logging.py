"""The SDK's logs: one JSON object per line, with the fields of the task being run.

Source: seed "Probes, metrics and logs". Every record becomes one line with ``ts`` (UTC, RFC
3339), ``level``, ``logger`` and ``msg``, plus ``task_id``, ``service`` and ``attempt`` when a task
is bound (the engine binds them around each handler call, threads included), plus the record's
own structured fields (the decision line's ``outcome``, ``action``, ``code``...).

The SDK adds its handler only if the application configured none on the root logger: an
application's own handlers and format are kept, and nothing is printed twice.
:class:`TaskContextFilter` then lets the application add the task fields to its own records.

Secrets: any ``scheme://user:password@`` in a line has its password replaced by ``***``. Task
inputs and responses are never passed to a logger by the SDK, and a handler's exception is
logged by type and frames only (:mod:`.redaction`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import IO, Any, Final

from async_task_api_worker.context import current_task_fields

__all__ = ["JsonFormatter", "TaskContextFilter", "configure_logging", "redact_secrets"]

#: The task fields, in the order they appear in a line.
TASK_FIELDS: Final = ("task_id", "service", "attempt")

# Every attribute a plain LogRecord has: anything else on a record came from ``extra``.
_RECORD_ATTRIBUTES: Final = frozenset(
    logging.LogRecord("", logging.INFO, "", 0, "", None, None).__dict__
) | {"message", "asctime", "taskName"}

# ``scheme://user:password@``: the password, up to the last ``@`` before the host.
_URL_CREDENTIALS: Final = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)(?P<password>[^\s@/]*)@"
)


def redact_secrets(text: str) -> str:
    """``text`` with the password of each ``scheme://user:password@host`` URL made ``***``."""
    if "://" not in text:
        return text
    return _URL_CREDENTIALS.sub(r"\g<head>***@", text)


class TaskContextFilter(logging.Filter):
    """Adds ``task_id``, ``service`` and ``attempt`` of the running task to each record.

    The fields come from the task bound by the engine around the handler call (a context
    variable, copied into the handler's threads), so records of any library the handler calls
    carry them too. A field the record already has (passed in ``extra``) is kept. Never drops a
    record.

    Attach it to a handler, or call it from a record factory (seed, "Probes, metrics and logs")::

        task_fields = TaskContextFilter()
        previous_factory = logging.getLogRecordFactory()

        def factory(*args, **kwargs):
            record = previous_factory(*args, **kwargs)
            task_fields.filter(record)
            return record

        logging.setLogRecordFactory(factory)
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the bound task's fields to ``record``; always ``True``."""
        fields = current_task_fields()
        if fields:
            for name in TASK_FIELDS:
                if name in fields and getattr(record, name, None) is None:
                    setattr(record, name, fields[name])
        return True


def _scalar(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line.

    Keys: ``ts`` (``2026-11-30T01:25:12.123456Z``), ``level``, ``logger``, ``msg``; then the
    task fields when bound; then the record's other ``extra`` fields that are not ``None``
    (values that are not JSON scalars become strings); ``exc`` holds a traceback when the
    record carries one. URL passwords are replaced by ``***`` in ``msg`` and ``exc``.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Return ``record`` as one line of JSON (no trailing newline)."""
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="microseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": redact_secrets(record.getMessage()),
        }
        for name in TASK_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = _scalar(value)
        for name, value in record.__dict__.items():
            if value is None or name in _RECORD_ATTRIBUTES or name in line or name.startswith("_"):
                continue
            line[name] = _scalar(value)
        if record.exc_info and record.exc_info[1] is not None:
            line["exc"] = redact_secrets(self.formatException(record.exc_info))
        elif record.exc_text:
            line["exc"] = redact_secrets(record.exc_text)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class _DowngradeToWarning(logging.Filter):
    """Logs ``aio_pika.tools`` errors as warnings.

    aio-pika logs a connection loss as two ERROR lines from callbacks that failed on the
    closing channel; the connection then recovers by itself, so they are warnings.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.WARNING:
            record.levelno = logging.WARNING
            record.levelname = logging.getLevelName(logging.WARNING)
        return True


def configure_logging(level: str, *, stream: IO[str] | None = None) -> bool:
    """Set up the SDK's JSON lines on ``stream`` (default: stdout) at ``level`` (``LOG_LEVEL``).

    If the root logger already has handlers (the application configured logging), they are
    kept, nothing is added, and only the SDK's own logger level is set: the format, and the
    level of every other logger, stay the application's. Calling it again adds nothing.

    Returns:
        Whether the SDK added its handler.
    """
    logging.getLogger("async_task_api_worker").setLevel(level)
    root = logging.getLogger()
    if root.handlers:
        return False
    # The broker client narrates every reconnect at INFO; the SDK says what matters itself.
    for chatty in ("aio_pika", "aiormq"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLevelName(level)))
    tools = logging.getLogger("aio_pika.tools")
    if not any(isinstance(known, _DowngradeToWarning) for known in tools.filters):
        tools.addFilter(_DowngradeToWarning())
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(TaskContextFilter())
    root.addHandler(handler)
    root.setLevel(level)
    return True
