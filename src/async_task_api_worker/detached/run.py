"""The detached worker's side: run the work, always leave a result, then drop the marker.

``python -m async_task_api_worker.detached --state-dir D --correlation-id C --handler H`` (what
:func:`~async_task_api_worker.detached.spawn.spawn_detached` starts). The worker records its
identity in the marker, runs the handler under the marker's deadline, and writes a result file
whatever happens: ``{"ok": true, "response": ...}`` or ``{"ok": false, "error": {"code",
"message"}}`` (a crash is a result too; seed 002, "a crash still yields a structured error
result"). At the deadline it writes ``TASK_TIMEOUT`` and kills its own process group.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from async_task_api_worker.context import (
    ProgressDropReason,
    ProgressUpdate,
    SyncTaskContext,
    TaskContext,
)
from async_task_api_worker.definition import HandlerKind
from async_task_api_worker.detached.state import (
    INPUT_SUFFIX,
    MARKER_SUFFIX,
    RESULT_SUFFIX,
    Marker,
    claim,
    process_start_time,
    read_json,
    write_atomically,
)
from async_task_api_worker.errors import TaskError, is_well_formed
from async_task_api_worker.observability.redaction import exception_type_name, safe_traceback
from async_task_api_worker.protocol.envelope import InputRef, describe_validation_error
from async_task_api_worker.targets import load_worker

__all__ = ["load_function", "main", "run_work"]

_finishing = threading.Lock()


def load_function(reference: str) -> Callable[..., Any]:
    """The function ``module:function`` or ``path/to/file.py:function`` names.

    A file is loaded by its path, its directory made importable first (a cron's child does not
    inherit ``PYTHONPATH``).

    Raises:
        ImportError, AttributeError: it cannot be found.
    """
    location, _, name = reference.rpartition(":")
    if location.endswith(".py"):
        path = Path(location).resolve()
        sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        module = importlib.import_module(location)
    return getattr(module, name)  # type: ignore[no-any-return]


def _failure(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"code": code, "message": message}}


def _error_of(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, TaskError) and is_well_formed(exc):
        return _failure(exc.task_code, exc.message)
    # The message is not published (it may hold anything); the log gets type and frames.
    print(f"{exception_type_name(exc)}\n{safe_traceback(exc)}", file=sys.stderr)
    return _failure("INTERNAL_ERROR", "the work failed with an internal error")


class _NoProgress:
    """A detached task has nobody to tell its progress to: updates are dropped."""

    def offer(self, update: ProgressUpdate) -> None:
        return None

    def drop(self, reason: ProgressDropReason) -> None:
        return None


def run_sdk_task(target: str, message: dict[str, Any]) -> dict[str, Any]:
    """Run the task of the SDK worker ``target`` on ``message`` (``input`` and ``context``).

    Outcomes map as in the engine: the response, a ``FatalError``'s or ``RetryableError``'s code
    (no retry: the tick concludes), ``INVALID_INPUT``, ``INVALID_RESULT``, ``INTERNAL_ERROR``.
    """
    task = load_worker(target).task_definition
    fields = message["context"]
    try:
        task_input = task.input_model.model_validate(message["input"])
    except ValidationError as exc:
        return _failure("INVALID_INPUT", f"invalid input: {describe_validation_error(exc)}")
    context_type = TaskContext if task.kind is HandlerKind.ASYNC else SyncTaskContext
    context = context_type(
        task_id=fields["task_id"],
        client_id=fields["client_id"],
        service=fields["service"],
        attempt=fields["attempt"],
        delivery_limit=fields["delivery_limit"],
        input_refs=tuple(InputRef.model_validate(ref) for ref in fields.get("input_refs", [])),
        sink=_NoProgress(),
        loop=None,
    )
    try:
        value = task.handler(task_input, context)
        if task.kind is HandlerKind.ASYNC:
            value = asyncio.run(value)
    except BaseException as exc:
        return _error_of(exc)
    try:
        model = (
            value
            if isinstance(value, task.output_model)
            else task.output_model.model_validate(value)
        )
        response = TypeAdapter(task.output_model).dump_python(model, mode="json", warnings="error")
        json.dumps(response, allow_nan=False)
    except Exception as exc:
        return _failure("INVALID_RESULT", f"the result cannot be reported ({type(exc).__name__})")
    return {"ok": True, "response": response}


def _finish(state_dir: Path, correlation_id: str, marker: Marker, result: dict[str, Any]) -> None:
    """Write the result, then drop the marker; nothing if a sweep already expired the marker."""
    with _finishing:
        # Claimed by rename, as a sweep claims it: of the two, exactly one reports the task.
        claimed = claim(state_dir / f"{correlation_id}{MARKER_SUFFIX}")
        if claimed is None:
            return  # a sweep reported it already: a second outcome would contradict it
        result = {**result, "correlation_id": correlation_id, "meta": marker.meta}
        write_atomically(
            state_dir / f"{correlation_id}{RESULT_SUFFIX}", json.dumps(result).encode()
        )
        claimed.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (state_dir / f"{correlation_id}{INPUT_SUFFIX}").unlink()


def run_work(state_dir: Path, correlation_id: str, handler: str, *, sdk_worker: bool) -> None:
    """Run the work of ``correlation_id`` here and leave its result (see the module)."""
    marker = Marker.from_json(read_json(state_dir / f"{correlation_id}{MARKER_SUFFIX}"))
    message = read_json(state_dir / f"{correlation_id}{INPUT_SUFFIX}")
    try:
        if sdk_worker:
            result = run_sdk_task(handler, message)
        else:
            response = load_function(handler)(message)
            if not isinstance(response, dict):
                raise TypeError(f"the handler returned {type(response).__name__}, not a dict")
            json.dumps(response, allow_nan=False)
            result = {"ok": True, "response": response}
    except BaseException as exc:
        result = _error_of(exc)
    _finish(state_dir, correlation_id, marker, result)


def _watch_deadline(state_dir: Path, correlation_id: str, marker: Marker) -> None:
    deadline = datetime.fromisoformat(marker.deadline_at).timestamp()
    # A duration inside this process: the monotonic clock, not the wall clock.
    remaining_s = max(0.0, deadline - time.time())
    started = time.monotonic()

    def expire() -> None:
        while time.monotonic() - started < remaining_s:  # a timer may fire a little early
            time.sleep(0.01)
        _finish(
            state_dir,
            correlation_id,
            marker,
            _failure("TASK_TIMEOUT", f"the work did not finish by {marker.deadline_at}"),
        )
        os.killpg(0, signal.SIGKILL)  # the worker and whatever it started

    timer = threading.Timer(remaining_s, expire)
    timer.daemon = True
    timer.start()


def main(argv: list[str] | None = None) -> None:
    """Entry point of a detached worker."""
    parser = argparse.ArgumentParser(prog="python -m async_task_api_worker.detached")
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--correlation-id", required=True)
    parser.add_argument("--handler", required=True)
    parser.add_argument("--sdk-worker", action="store_true")
    arguments = parser.parse_args(argv)
    if os.getpgid(0) != os.getpid():
        os.setsid()  # the worker leads its own group: a sweep can kill it whole, by its pid
    state_dir: Path = arguments.state_dir
    correlation_id: str = arguments.correlation_id
    marker_path = state_dir / f"{correlation_id}{MARKER_SUFFIX}"
    marker = Marker.from_json(read_json(marker_path))
    marker.pid = os.getpid()
    marker.start_time = process_start_time(marker.pid)
    write_atomically(marker_path, marker.to_json())
    _watch_deadline(state_dir, correlation_id, marker)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"{started} detached worker {correlation_id}: pid {marker.pid}", file=sys.stderr)
    run_work(state_dir, correlation_id, arguments.handler, sdk_worker=arguments.sdk_worker)
