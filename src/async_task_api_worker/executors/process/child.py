"""The child's side of a process-isolated task: read the request, run the task call, answer.

Runs in the task's own process, forked by the fork server or spawned as a fresh interpreter
(``python -m async_task_api_worker.executors.process.child``). The handler runs through the
task call (:func:`~async_task_api_worker.task_call.call_here`), as in every face, and its
conclusion goes back as the one outcome message. The child's stdout and stderr are pipes the
worker drains; the messages go on the channel only (see :mod:`.channel`). When the request
names a lease, the group's watchdog is forked first (:func:`.lease.fence`), before the handler
and its limits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import resource
import socket
import sys
from collections.abc import Callable
from typing import Any, cast

from async_task_api_worker.conclusion import Conclusion, Failure
from async_task_api_worker.context import ProgressDropReason, ProgressUpdate
from async_task_api_worker.definition import TASK_PROCESS_ENV, TaskDefinition, read_task
from async_task_api_worker.errors import RemoteHandlerError
from async_task_api_worker.executors.process.channel import (
    ChildChannel,
    DropMessage,
    LogMessage,
    OutcomeMessage,
    ProgressMessage,
    TaskRequest,
)
from async_task_api_worker.executors.process.group import become_subreaper, die_with_parent
from async_task_api_worker.executors.process.lease import fence, unfence
from async_task_api_worker.observability.logging import RECORD_ATTRIBUTES, json_scalar
from async_task_api_worker.observability.redaction import exception_type_name, safe_traceback
from async_task_api_worker.protocol.codes import ErrorCode
from async_task_api_worker.targets import load_reference
from async_task_api_worker.task_call import call_here, sendable

__all__ = ["become_subreaper", "die_with_parent", "load_handler", "serve_one"]

# Memory set aside at import and released on a MemoryError: the answer needs some.
_RESERVE: bytearray | None = bytearray(1 << 20)


def load_handler(reference: str, main_path: str | None = None) -> Callable[..., Any]:
    """The handler ``module:qualified.name`` names (``targets.load_reference``).

    Raises:
        ImportError: the module cannot be imported.
        AttributeError: it has no such function.
    """
    return cast("Callable[..., Any]", load_reference(reference, main_path=main_path))


class _ChannelSink:
    """Forwards the child context's checked progress updates (and drops) to the worker."""

    def __init__(self, channel: ChildChannel) -> None:
        self._channel = channel

    def offer(self, update: ProgressUpdate) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._channel.send(ProgressMessage(update).to_json())

    def drop(self, reason: ProgressDropReason) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._channel.send(DropMessage(reason).to_json())


class _ChannelLogHandler(logging.Handler):
    """Sends each record to the worker, which logs it in its own format with the task fields."""

    def __init__(self, channel: ChildChannel) -> None:
        super().__init__()
        self._channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            extra = {
                name: json_scalar(value)
                for name, value in record.__dict__.items()
                if name not in RECORD_ATTRIBUTES and not name.startswith("_")
            }
            exc = None
            if record.exc_info and record.exc_info[1] is not None:
                exc = logging.Formatter().formatException(record.exc_info)
            message = LogMessage(record.levelno, record.name, record.getMessage(), extra, exc)
            self._channel.send(message.to_json())
        except Exception:
            self.handleError(record)


def _set_up_logging(channel: ChildChannel, level: int) -> None:
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.addHandler(_ChannelLogHandler(channel))
    root.setLevel(level)


def _apply_limits(request: TaskRequest) -> None:
    if request.memory_limit_bytes is not None:
        memory = request.memory_limit_bytes
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    if request.cpu_limit_s is not None:
        # The soft limit sends SIGXCPU (the worker reports it as a crash); the hard one, a
        # second later, SIGKILL for a process that ignores it.
        seconds = max(1, int(-(-request.cpu_limit_s // 1)))
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))


def _release_reserve(exc: BaseException) -> None:
    """Free the memory set aside, so that a ``MemoryError``'s answer has room to be made."""
    global _RESERVE  # noqa: PLW0603 - released once, to have room for the answer
    if isinstance(exc, MemoryError):
        _RESERVE = None


def _raised(conclusion: Conclusion, raised: list[BaseException]) -> RemoteHandlerError | None:
    """What the worker's error hooks learn of an ``INTERNAL_ERROR``: the type and frames."""
    if not raised or not isinstance(conclusion, Failure):
        return None
    if conclusion.code != ErrorCode.INTERNAL_ERROR:
        return None
    return RemoteHandlerError(exception_type_name(raised[-1]), safe_traceback(raised[-1]))


def serve_one(channel_fd: int, task: TaskDefinition) -> int:
    """Run one task in this process: read the request on ``channel_fd``, send the outcome.

    Returns:
        The exit code: 0 once the outcome is sent, 3 if the channel failed.
    """
    sock = socket.socket(fileno=channel_fd)
    channel = ChildChannel(sock)
    watchdog: int | None = None
    try:
        request = TaskRequest.from_json(channel.receive())
        if request.lease_s is not None:
            try:
                watchdog = fence(channel_fd, request.lease_s)
            except OSError:  # no watchdog, no run: nothing may outlive a frozen worker
                unfenced = Failure(ErrorCode.WORKER_CRASHED, "the task's process could not fork")
                channel.send(OutcomeMessage(unfenced).to_json())
                return 0
        _set_up_logging(channel, request.log_level)
        _apply_limits(request)
        raised: list[BaseException] = []

        def on_exception(exc: BaseException) -> None:
            _release_reserve(exc)
            raised.append(exc)

        conclusion = call_here(
            task,
            request.raw_input,
            request.fields,
            _ChannelSink(channel),
            memory_limit_bytes=request.memory_limit_bytes,
            on_exception=on_exception,
        )
        # Checked here, not by the worker: the channel's JSON escapes two raw surrogates side
        # by side as a pair, which reads back joined into one valid character.
        channel.send(OutcomeMessage(sendable(conclusion), _raised(conclusion, raised)).to_json())
    except Exception:
        return 3
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if watchdog is not None:
            unfence(watchdog)
    return 0


def main(argv: list[str] | None = None) -> None:
    """Entry point of a freshly spawned task process: load the handler, serve, exit.

    The fallback when there is no fork server (``python -m async_task_api_worker.executors.
    process child --handler REF --channel-fd N``).
    """
    parser = argparse.ArgumentParser(prog="async_task_api_worker.executors.process child")
    parser.add_argument("--handler", required=True)
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--main-path")
    parser.add_argument("--sys-path", default="[]")
    arguments = parser.parse_args(argv)
    os.environ[TASK_PROCESS_ENV] = "1"
    die_with_parent()
    sys.path[:0] = [p for p in json.loads(arguments.sys_path) if p not in sys.path]
    try:
        task = read_task(load_handler(arguments.handler, arguments.main_path), 1.0)
    except BaseException as exc:
        print(f"cannot load the handler ({exception_type_name(exc)})", file=sys.stderr)
        os._exit(4)
    os._exit(serve_one(arguments.channel_fd, task))
