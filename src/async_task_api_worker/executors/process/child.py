"""The child's side of a process-isolated task: read the request, run the handler, answer.

Runs in the task's own process, forked by the fork server or spawned as a fresh interpreter
(``python -m async_task_api_worker.executors.process.child``). The child's stdout and stderr
are pipes the worker drains; the answer goes on the channel only (see :mod:`.channel`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import importlib
import importlib.util
import json
import logging
import os
import resource
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError

from async_task_api_worker.context import (
    ProgressDropReason,
    ProgressUpdate,
    SyncTaskContext,
    TaskContext,
    bind_task_fields,
)
from async_task_api_worker.definition import (
    TASK_PROCESS_ENV,
    HandlerKind,
    TaskDefinition,
    read_task,
)
from async_task_api_worker.errors import TaskError, is_well_formed
from async_task_api_worker.executors.process.channel import ChildChannel
from async_task_api_worker.observability.logging import RECORD_ATTRIBUTES, json_scalar
from async_task_api_worker.observability.redaction import exception_type_name, safe_traceback
from async_task_api_worker.protocol.envelope import InputRef, describe_validation_error

__all__ = ["become_subreaper", "die_with_parent", "load_handler", "serve_one"]

#: Characters of a log message the child sends (a longer one is cut).
MAX_LOG_CHARS: Final = 32 * 1024
_PR_SET_PDEATHSIG: Final = 1
# Memory set aside at import and released on a MemoryError: the answer needs some.
_RESERVE: bytearray | None = bytearray(1 << 20)
_PR_SET_CHILD_SUBREAPER: Final = 36


def load_handler(reference: str, main_path: str | None = None) -> Callable[..., Any]:
    """The function ``module:qualified.name`` names.

    A handler defined in the worker's ``__main__`` script is loaded from ``main_path`` under
    the name ``__mp_main__`` (as multiprocessing does), so the script's
    ``if __name__ == "__main__":`` block does not run again.

    Raises:
        ImportError: the module cannot be imported.
        AttributeError: it has no such function.
    """
    module_name, _, qualname = reference.partition(":")
    if module_name == "__main__":
        if main_path is None:
            raise ImportError("the handler is in __main__, and the script's path is unknown")
        module = sys.modules.get("__mp_main__")
        if module is None:
            spec = importlib.util.spec_from_file_location("__mp_main__", main_path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {main_path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules["__mp_main__"] = module
            spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part)
    return target  # type: ignore[no-any-return]


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(Exception):  # not Linux: the protection is simply not there
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def become_subreaper() -> None:
    """Make this process the parent of its orphaned descendants (Linux).

    It then reaps them: a task's killed grandchildren do not linger as zombies, whatever
    PID 1 does.
    """
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


class _ChannelSink:
    """Forwards the child context's checked progress updates (and drops) to the worker."""

    def __init__(self, channel: ChildChannel) -> None:
        self._channel = channel

    def offer(self, update: ProgressUpdate) -> None:
        payload = None if update.payload is None else dict(update.payload)
        with contextlib.suppress(OSError, ValueError):
            self._channel.send({"t": "progress", "fraction": update.fraction, "payload": payload})

    def drop(self, reason: ProgressDropReason) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._channel.send({"t": "drop", "reason": reason.value})


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
            self._channel.send(
                {
                    "t": "log",
                    "level": record.levelno,
                    "name": record.name,
                    "msg": record.getMessage()[:MAX_LOG_CHARS],
                    "extra": extra,
                    "exc": exc,
                }
            )
        except Exception:
            self.handleError(record)


def _set_up_logging(channel: ChildChannel, level: int) -> None:
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.addHandler(_ChannelLogHandler(channel))
    root.setLevel(level)


def _apply_limits(limits: dict[str, Any]) -> None:
    memory = limits.get("memory_limit_bytes")
    if memory is not None:
        resource.setrlimit(resource.RLIMIT_AS, (int(memory), int(memory)))
    cpu = limits.get("cpu_limit_s")
    if cpu is not None:
        # The soft limit sends SIGXCPU (the worker reports it as a crash); the hard one, a
        # second later, SIGKILL for a process that ignores it.
        seconds = max(1, int(-(-float(cpu) // 1)))
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))


def _answer(task: TaskDefinition, value: Any) -> dict[str, Any]:
    output = task.output_model
    try:
        model = value if isinstance(value, output) else output.model_validate(value)
        response = TypeAdapter(output).dump_python(model, mode="json", warnings="error")
        json.dumps(response, ensure_ascii=True)
    except ValidationError as exc:
        return {
            "t": "invalid_result",
            "message": "the handler's result failed its output model: "
            f"{describe_validation_error(exc)}",
        }
    except Exception as exc:
        return {
            "t": "invalid_result",
            "message": f"the handler's result could not be serialized ({exception_type_name(exc)})",
        }
    return {"t": "result", "value": response}


def _failure(exc: BaseException, limits: dict[str, Any]) -> dict[str, Any]:
    if isinstance(exc, TaskError) and is_well_formed(exc):
        retry_delay_s = getattr(exc, "retry_delay_s", None)
        return {
            "t": "error",
            "kind": "retryable" if exc.retryable else "fatal",
            "code": exc.task_code,
            "message": exc.message,
            "retry_delay_s": retry_delay_s,
        }
    if isinstance(exc, MemoryError) and limits.get("memory_limit_bytes") is not None:
        global _RESERVE  # noqa: PLW0603 - released once, to have room for the answer
        _RESERVE = None
        return {
            "t": "crash",
            "message": f"the task hit its memory limit of {limits['memory_limit_bytes']} bytes",
        }
    return {
        "t": "error",
        "kind": "internal",
        "type": exception_type_name(exc),
        "traceback": safe_traceback(exc),
    }


def _run(task: TaskDefinition, request: dict[str, Any], channel: ChildChannel) -> dict[str, Any]:
    fields = request["context"]
    limits = request.get("limits") or {}
    context_type = TaskContext if task.kind is HandlerKind.ASYNC else SyncTaskContext
    context = context_type(
        task_id=fields["task_id"],
        client_id=fields["client_id"],
        service=fields["service"],
        attempt=fields["attempt"],
        delivery_limit=fields["delivery_limit"],
        input_refs=tuple(InputRef.model_validate(ref) for ref in fields["input_refs"]),
        sink=_ChannelSink(channel),
        loop=None,  # progress is sent from the calling thread, whichever it is
    )
    bound = {name: fields[name] for name in ("task_id", "service", "attempt")}
    with bind_task_fields(bound):
        try:
            _apply_limits(limits)
            task_input = task.input_model.model_validate(request["input"])
            if task.kind is HandlerKind.ASYNC:
                value = asyncio.run(task.handler(task_input, context))
            else:
                value = task.handler(task_input, context)
        except BaseException as exc:  # SystemExit included: the worker decides what it means
            return _failure(exc, limits)
        return _answer(task, value)


def serve_one(channel_fd: int, task: TaskDefinition) -> int:
    """Run one task in this process: read the request on ``channel_fd``, send the answer.

    Returns:
        The exit code: 0 once the answer is sent, 3 if the channel failed.
    """
    sock = socket.socket(fileno=channel_fd)
    channel = ChildChannel(sock)
    try:
        request = channel.receive()
        _set_up_logging(channel, int(request.get("log_level", logging.INFO)))
        answer = _run(task, request, channel)
        try:
            channel.send(answer)
        except ValueError:  # not JSON after all (a float the encoder refuses)
            channel.send({"t": "invalid_result", "message": "the result is not JSON"})
    except Exception:
        return 3
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
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
