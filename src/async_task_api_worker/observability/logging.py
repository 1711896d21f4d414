"""The SDK's logs: one line per record, with the fields of the task being run.

Source: seed "Probes, metrics and logs". Every record becomes one line with ``ts`` (UTC, RFC
3339), ``level``, ``logger`` and ``msg``, plus ``task_id``, ``service`` and ``attempt`` while a
task runs (the engine binds them around each handler call; asyncio tasks, ``asyncio.to_thread``
and the ``def`` handler threads copy them), plus the record's own structured fields (the
decision line's ``outcome``, ``action``, ``code``...). :func:`record_fields` picks them; the
line is a JSON object (:class:`JsonFormatter`, ``LOG_FORMAT=json``) or text for a person
(:class:`TextFormatter`, ``LOG_FORMAT=text``).

The SDK adds its handler only if the application configured none on the root logger: an
application's own handlers and format are kept, and nothing is printed twice.
:class:`TaskContextFilter` then lets the application add the task fields to its own records.

Secrets: any ``scheme://user:password@`` in a line has its password replaced by ``***``. Task
inputs and responses are never passed to a logger by the SDK, and a handler's exception is
logged by type and frames only (:mod:`.redaction`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, Any, Final

from async_task_api_worker.context import current_task_fields
from async_task_api_worker.observability import tracing

__all__ = [
    "RECORD_ATTRIBUTES",
    "JsonFormatter",
    "TaskContextFilter",
    "TextFormatter",
    "configure_logging",
    "json_scalar",
    "record_fields",
    "redact_secrets",
    "when_stream_closed",
]

#: The task fields, in the order they appear in a line.
TASK_FIELDS: Final = ("task_id", "service", "attempt")

#: Every attribute a plain LogRecord has: anything else on a record came from ``extra``.
RECORD_ATTRIBUTES: Final = frozenset(
    logging.LogRecord("", logging.INFO, "", 0, "", None, None).__dict__
) | {"message", "asctime", "taskName"}

# Where a URL surely ends. Not a quote: a password may hold one, and hiding too much is the
# safe side.
_URL_END: Final = re.compile(r"\s")


def redact_secrets(text: str) -> str:
    """``text`` with the password of each ``scheme://user:password@host`` URL made ``***``.

    After each ``://``, everything from the first ``:`` to the last ``@`` before the next
    whitespace is replaced: a password holding ``@``, ``/``, ``:`` or a quote is covered, at
    the price of hiding a little more when a path, a query or what follows holds an ``@``.
    Linear in the length of ``text`` (a log line may hold a whole task input).
    """
    start = text.find("://")
    if start == -1:
        return text
    parts: list[str] = []
    kept_from = 0
    while start != -1:
        authority = start + 3
        found = _URL_END.search(text, authority)
        end = found.start() if found else len(text)
        at = text.rfind("@", authority, end)
        if at != -1:
            colon = text.find(":", authority, at)
            if colon != -1:
                parts.append(text[kept_from : colon + 1])
                parts.append("***")
                kept_from = at
        start = text.find("://", end)
    parts.append(text[kept_from:])
    return "".join(parts)


class TaskContextFilter(logging.Filter):
    """Adds ``task_id``, ``service`` and ``attempt`` of the running task to each record.

    With tracing on (``observability.tracing``), it adds ``trace_id`` and ``span_id`` of the
    current span too (hex, as trace back ends show them): a task's lines, its decision line
    included, carry its delivery's span.

    The fields come from the task bound by the engine around the handler call (a context
    variable, copied into the handler's threads), so records of any library the handler calls
    carry them too. A field the record already has (passed in ``extra``) is kept. Never drops a
    record.

    Attach it to a handler, or call it from a record factory (docs/operations.md, the logs):

        task_fields = TaskContextFilter()
        previous_factory = logging.getLogRecordFactory()

        def factory(*args, **kwargs):
            record = previous_factory(*args, **kwargs)
            task_fields.filter(record)
            return record

        logging.setLogRecordFactory(factory)
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the bound task's fields, and the current span's ids, to ``record``; ``True``."""
        fields = current_task_fields()
        if fields:
            for name in TASK_FIELDS:
                if name in fields and getattr(record, name, None) is None:
                    setattr(record, name, fields[name])
        ids = tracing.current_ids()
        if ids is not None and getattr(record, "trace_id", None) is None:
            record.trace_id, record.span_id = ids
        return True


#: Characters of a message (and of a traceback) kept in a line; the rest is cut and counted.
MAX_MESSAGE_CHARS: Final = 64 * 1024
#: Characters of one ``extra`` value kept in a line.
MAX_FIELD_CHARS: Final = 4096
_SAFE_INT: Final = 2**63


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def json_scalar(value: Any) -> Any:
    """A JSON-safe value for a field: never raises, never ``NaN``, never huge."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        # str() of an int over 4,300 digits raises; a JSON reader may round one over 2**63.
        return (
            value
            if -_SAFE_INT < value < _SAFE_INT
            else f"(an integer of {value.bit_length()} bits)"
        )
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception as exc:
        return f"(unprintable {type(value).__name__}: its str() raised {type(exc).__name__})"
    return redact_secrets(_cut(text, MAX_FIELD_CHARS))


def _message(record: logging.LogRecord) -> str:
    try:
        message = record.getMessage()
    except Exception as exc:
        # Never the arguments (the very thing that may hold a secret), only the template.
        template = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
        message = f"{template} (the arguments could not be formatted: {type(exc).__name__})"
    return redact_secrets(_cut(message, MAX_MESSAGE_CHARS))


def record_fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, Any]:
    """The fields of ``record``'s line, in their order; what every format writes.

    ``ts`` (``2026-11-30T01:25:12.123456Z``), ``level``, ``logger``, ``msg``; then the task
    fields when bound; then the record's other ``extra`` fields that are not ``None`` (values
    that are not JSON scalars become strings, cut at 4,096 characters); ``exc`` holds a
    traceback when the record carries one (formatted by ``formatter``), ``stack`` its stack
    info. URL passwords are replaced by ``***`` in every string, keys included. A message is
    cut at 64 KiB. Never raises: a message whose arguments cannot be formatted is its template,
    without them.
    """
    line: dict[str, Any] = {
        "ts": datetime.fromtimestamp(record.created, UTC)
        .isoformat(timespec="microseconds")
        .replace("+00:00", "Z"),
        "level": record.levelname,
        "logger": record.name,
        "msg": _message(record),
    }
    for name in TASK_FIELDS:
        value = getattr(record, name, None)
        if value is not None:
            line[name] = json_scalar(value)
    for name, value in record.__dict__.items():
        if value is None or name in RECORD_ATTRIBUTES or name in line or name.startswith("_"):
            continue
        line[redact_secrets(str(name))] = json_scalar(value)  # a key may hold a URL too
    exc = record.exc_text
    if record.exc_info and record.exc_info[1] is not None:
        try:
            exc = formatter.formatException(record.exc_info)
        except Exception as error:
            exc = f"(the traceback could not be formatted: {type(error).__name__})"
    if exc:
        line["exc"] = redact_secrets(_cut(exc, MAX_MESSAGE_CHARS))
    if record.stack_info:
        line["stack"] = _cut(formatter.formatStack(record.stack_info), MAX_MESSAGE_CHARS)
    return line


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line: the keys of :func:`record_fields`."""

    def format(self, record: logging.LogRecord) -> str:
        """Return ``record`` as one line of JSON (no trailing newline)."""
        # ASCII only: a lone surrogate (from a task input) travels escaped, and never makes
        # the write to the stream fail.
        return json.dumps(record_fields(record, self), ensure_ascii=True)


# What would end a line for some reader (str.splitlines breaks at all of these) or could not be
# written to a UTF-8 stream (a lone surrogate, from a task input): written as JSON escapes.
_UNSAFE: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
# A value with one of these is quoted, so that ``key=value`` pairs stay apart.
_QUOTED: Final = re.compile(r'[\s"=\\]')


def _escaped(text: str) -> str:
    return _UNSAFE.sub(lambda found: json.dumps(found.group())[1:-1], text)


def _text_value(value: Any) -> str:
    if not isinstance(value, str):
        return json.dumps(value)  # a number, true or false, as in the JSON line
    if value and not _QUOTED.search(value) and not _UNSAFE.search(value):
        return value
    return _escaped(json.dumps(value, ensure_ascii=False))


#: Fields a message says inside another's ``name=`` (the decision line's ``attempt=1/5``).
_SAID_WITH: Final = {"delivery_limit": "attempt"}


def _said(name: str, message: str) -> bool:
    """Whether ``message`` says the field ``name`` already, as ``name=...`` (decision lines)."""
    return f" {_SAID_WITH.get(name, name)}=" in message


class TextFormatter(logging.Formatter):
    r"""Formats a record as one line of text for a person, with the fields of the JSON line.

    ``2026-12-02T05:21:24.123456Z INFO  async_task_api_worker.engine Task done task_id=abc
    attempt=1 outcome=success``: ``ts``, ``level`` (padded to five), ``logger`` and ``msg``,
    then every other field of :func:`record_fields` that the message does not say already
    (``Delivery settled: outcome=success ... attempt=1/5`` says ``outcome``, ``attempt`` and
    ``delivery_limit``) as ``key=value``, a value quoted as a JSON
    string when it is empty or holds white space, ``"``, ``=`` or ``\``. Line breaks (a
    traceback's too) and lone surrogates are written as JSON escapes (``\n``): one record, one
    line.
    """

    def format(self, record: logging.LogRecord) -> str:
        """Return ``record`` as one line of text (no trailing newline)."""
        fields = record_fields(record, self)
        head = (
            f"{fields.pop('ts')} {fields.pop('level'):<5} {_escaped(fields.pop('logger'))} "
            f"{_escaped(fields.pop('msg'))}"
        )
        pairs = (
            f"{_escaped(name)}={_text_value(value)}"
            for name, value in fields.items()
            if not _said(name, head)
        )
        return " ".join((head, *pairs))


#: What a running worker does when the reader of its log stream goes away (``run ... | head``):
#: set by ``runtime.signals`` to ask for a drain, as SIGTERM does; nothing elsewhere.
_on_closed: list[Callable[[], object]] = []
#: Whether it is gone already (before the worker could be told: its first lines).
_closed = threading.Event()


def when_stream_closed(callback: Callable[[], object] | None) -> None:
    """Call ``callback`` once, from any thread, when the log stream's reader is gone (or now)."""
    _on_closed[:] = [] if callback is None else [callback]
    if callback is not None and _closed.is_set():
        _on_closed.clear()
        callback()


class _LinesHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that, if a line cannot be written, says so in one line of its own.

    The standard ``handleError`` prints the record's message and arguments, unredacted, to
    stderr; this one prints neither, in the handler's own format. A stream whose reader is gone
    (``BrokenPipeError``) is said once, then replaced by /dev/null, and :func:`when_stream_closed`'s
    callback runs: a process writes nothing more to a dead pipe, as SIGPIPE would have it.
    """

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, BrokenPipeError):
            self._reader_gone()
        name, why = record.name, type(error).__name__
        self._say(
            f"The log stream's reader is gone: logs of {name} and after are dropped"
            if isinstance(error, BrokenPipeError)
            else f"A log record of {name} could not be written ({why})"
        )

    def _say(self, message: str) -> None:
        with contextlib.suppress(Exception):
            said = logging.LogRecord(__name__, logging.ERROR, __file__, 0, message, None, None)
            sys.stderr.write((self.formatter or JsonFormatter()).format(said) + "\n")

    def _reader_gone(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # its buffer must not reach the pipe
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        self.stream = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives with us
        _closed.set()
        for callback in _on_closed:
            callback()
        _on_closed.clear()


#: The broker client's lines for each failed connection attempt (aiormq's, then aio-pika's on a
#: reconnect), by logger and the start of their template. The SDK logs its own line per retry
#: (``Cannot reach the broker ...``; ``The connection ... closed ...; reconnecting``).
_ATTEMPT_FAILED: Final = (
    ("aiormq.connection", "error when creating transport"),
    ("aio_pika.robust_connection", "Connection attempt to "),
)


class _DowngradeToWarning(logging.Filter):
    """Logs the broker client's errors as warnings, without tracebacks.

    aio-pika and aiormq log a connection loss, a failed reconnect attempt and a callback that
    failed on the closing channel as ERROR lines, some with a traceback; the connection then
    recovers by itself (and the SDK says what happened to the deliveries), so they are
    warnings, and the exception's type is enough. Their lines for a failed connection attempt
    repeat the SDK's own line of that retry: they are DEBUG lines, shown at ``LOG_LEVEL=DEBUG``
    only.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        template = record.msg if isinstance(record.msg, str) else ""
        if any(
            record.name == name and template.startswith(start) for name, start in _ATTEMPT_FAILED
        ):
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
            return logging.getLogger("async_task_api_worker").isEnabledFor(logging.DEBUG)
        if record.levelno > logging.WARNING:
            record.levelno = logging.WARNING
            record.levelname = logging.getLevelName(logging.WARNING)
        if record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.getMessage()} ({type(record.exc_info[1]).__name__})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def configure_logging(
    level: str, *, log_format: str = "json", stream: IO[str] | None = None
) -> bool:
    """Set up the SDK's log lines on ``stream`` (default: stdout) at ``level`` (``LOG_LEVEL``).

    ``log_format`` (``LOG_FORMAT``) is ``json`` (:class:`JsonFormatter`) or ``text``
    (:class:`TextFormatter`).

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
    for noisy in {"aio_pika.tools", *(name for name, _ in _ATTEMPT_FAILED)}:
        client = logging.getLogger(noisy)
        if not any(isinstance(known, _DowngradeToWarning) for known in client.filters):
            client.addFilter(_DowngradeToWarning())
    handler = _LinesHandler(stream or sys.stdout)
    handler.setFormatter(TextFormatter() if log_format == "text" else JsonFormatter())
    handler.addFilter(TaskContextFilter())
    root.addHandler(handler)
    root.setLevel(level)
    return True
