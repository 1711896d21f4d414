"""The detached worker's side: run the work, always leave a result, then drop the marker.

``python -m async_task_api_worker.detached --state-dir D --correlation-id C --handler H`` (what
:func:`~async_task_api_worker.detached.spawn.spawn_detached` starts). The worker records its
identity in the marker, runs the handler under the marker's deadline, and writes a result file
whatever happens: the conclusion in the one conclusion JSON (``outcomes.result_file``; a crash
is a result too, seed 002). An SDK task runs through the task call (``task_call.call_here``),
as in every face. At the deadline it writes ``TASK_TIMEOUT`` and kills its own process group.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from async_task_api_worker.conclusion import Conclusion
from async_task_api_worker.detached.claims import claim, process_start_time
from async_task_api_worker.detached.marker import Marker
from async_task_api_worker.detached.outcomes import result_file
from async_task_api_worker.detached.state import (
    DONE_SUFFIX,
    INPUT_SUFFIX,
    MARKER_SUFFIX,
    RESULT_SUFFIX,
    SYSTEM_CLOCKS,
    Clocks,
    read_json,
    write_atomically,
)
from async_task_api_worker.targets import load_reference, load_worker
from async_task_api_worker.task_call import (
    DISCARD_PROGRESS,
    TaskFields,
    call_function,
    call_here,
    conclude_error,
    sendable,
    timed_out,
)

__all__ = ["finish", "load_function", "main", "run_work", "watch_deadline"]

_finishing = threading.Lock()
# The result files this process wrote: one outcome each, the first of the work and the watchdog.
_finished: set[Path] = set()


def load_function(reference: str) -> Callable[..., Any]:
    """The function ``module:function`` or ``path/to/file.py:function`` names.

    The one loader (``targets.load_reference``): a file is loaded by its path, its directory
    made importable first (a cron's child does not inherit ``PYTHONPATH``).

    Raises:
        ImportError, AttributeError: it cannot be found.
    """
    function = load_reference(reference)
    if not callable(function):
        raise TypeError(f"{reference} is not a function")
    return function  # type: ignore[no-any-return]


def run_sdk_task(target: str, message: dict[str, Any]) -> Conclusion:
    """Run the task of the SDK worker ``target`` on ``message`` (``input`` and ``context``).

    Through the task call (``task_call.call_here``), as every face runs a handler: the same
    code and message as in the worker itself. A ``RetryableError`` is not retried here: the
    tick concludes with its code.

    Returns:
        The task call's conclusion.
    """
    task = load_worker(target).task_definition
    try:
        fields = TaskFields.from_json(message["context"])
        raw_input = message["input"]
        if not isinstance(raw_input, dict):
            raise TypeError("the input is not a JSON object")
    except (KeyError, TypeError, ValueError) as exc:
        return conclude_error(exc)
    # Checked here: the result file's JSON escapes two raw surrogates side by side as a pair,
    # which the sweep reads back joined into one valid character (the report checks no more).
    return sendable(call_here(task, raw_input, fields, DISCARD_PROGRESS))


def _run_function(handler: str, message: dict[str, Any]) -> Conclusion:
    """Run a plain function (seed 002): a JSON object in, a JSON object out."""
    return call_function(lambda: load_function(handler)(message))


def finish(state_dir: Path, correlation_id: str, marker: Marker, conclusion: Conclusion) -> None:
    """Write the result file (once), marker or not, unless the task was reported already.

    The marker is claimed by rename, as a sweep claims it, and dropped after the write. If it
    is gone (a sweep expired it, or moved it aside as unreadable), the result is written all
    the same, with the ``meta`` of the marker read at the start: ``<id>.done`` alone says that
    a sweep sent an outcome, and then a second one would contradict it (a sweep that finds
    ``<id>.done`` drops a result written in the meantime). ``<id>.input`` stays for the sweep.
    """
    result_path = state_dir / f"{correlation_id}{RESULT_SUFFIX}"
    with _finishing:
        if result_path in _finished:
            return  # the work and the watchdog: the first one's outcome stands
        _finished.add(result_path)
        claimed = claim(state_dir / f"{correlation_id}{MARKER_SUFFIX}")
        if not (state_dir / f"{correlation_id}{DONE_SUFFIX}").exists():
            result = result_file(correlation_id, conclusion, marker.meta)
            write_atomically(result_path, json.dumps(result).encode())
        if claimed is not None:
            claimed.unlink(missing_ok=True)


def run_work(
    state_dir: Path,
    correlation_id: str,
    handler: str,
    *,
    sdk_worker: bool,
    marker: Marker | None = None,
) -> None:
    """Run the work of ``correlation_id`` here and leave its result (see the module).

    Args:
        state_dir: the state directory.
        correlation_id: the work's id.
        handler: the ``module:worker`` (``sdk_worker``) or the function to run.
        sdk_worker: ``handler`` names an SDK worker.
        marker: the marker as this worker read it; ``None`` reads it (the synchronous fallback
            of ``spawn_detached``). A worker passes its own: the file may be gone or unreadable
            by now, and its result must be written all the same.
    """
    if marker is None:
        marker = Marker.from_json(read_json(state_dir / f"{correlation_id}{MARKER_SUFFIX}"))
    conclusion: Conclusion
    try:
        message = read_json(state_dir / f"{correlation_id}{INPUT_SUFFIX}")
    except (OSError, ValueError) as exc:
        conclusion = conclude_error(exc)
    else:
        run = run_sdk_task if sdk_worker else _run_function
        conclusion = run(handler, message)
    finish(state_dir, correlation_id, marker, conclusion)


def _kill_own_group() -> None:
    os.killpg(0, signal.SIGKILL)  # the worker and whatever it started


def watch_deadline(
    state_dir: Path,
    correlation_id: str,
    marker: Marker,
    *,
    clocks: Clocks = SYSTEM_CLOCKS,
    kill: Callable[[], None] = _kill_own_group,
) -> threading.Event:
    """At the marker's deadline, on the boot clock, write ``TASK_TIMEOUT`` and ``kill()``.

    The time left is the marker's duration less what passed since its start on the boot clock
    (a start in the future counts as now): a step of the wall clock moves neither.

    Returns:
        An event that stops the watch when set.
    """
    ends = clocks.boot() + marker.remaining_s(clocks)
    stop = threading.Event()

    def watch() -> None:
        # Polled on the boot clock: a sleep's own clock may stop during a suspend.
        while (left := ends - clocks.boot()) > 0:
            if stop.wait(min(left, 1.0)):
                return
        if stop.is_set():
            return
        finish(state_dir, correlation_id, marker, timed_out(marker.duration_s))
        kill()

    threading.Thread(target=watch, name=f"deadline-{correlation_id}", daemon=True).start()
    return stop


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
    if marker.deadline_s is not None:
        # The task's time runs from here, as a handler's does in the worker: an interpreter
        # slow to start on a loaded machine does not eat into it.
        marker = marker.restarted()
    marker.pid = os.getpid()
    marker.start_time = process_start_time(marker.pid)
    write_atomically(marker_path, marker.to_json())
    watchdog = watch_deadline(state_dir, correlation_id, marker)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"{started} detached worker {correlation_id}: pid {marker.pid}", file=sys.stderr)
    run_work(
        state_dir, correlation_id, arguments.handler, sdk_worker=arguments.sdk_worker, marker=marker
    )
    watchdog.set()
