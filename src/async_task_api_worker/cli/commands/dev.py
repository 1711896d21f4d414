"""``dev my_module:worker [FILE]``: the worker on the embedded broker, reports on stdout.

Each line of FILE (or stdin) is a task input, a JSON object; each published report is printed
as one JSON line, its canonical bytes, as soon as it is confirmed. A line that is not a JSON
object is reported on stderr and skipped. Logs go to stderr: text lines when stderr is a
terminal and ``LOG_FORMAT`` (or ``--log-format``) is not set, else as ``LOG_FORMAT`` says.
There is no probes server in ``dev``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import sys
import threading
from collections.abc import Mapping
from typing import IO

from async_task_api_worker.cli.inputs import json_object, readable
from async_task_api_worker.cli.loading import load_target
from async_task_api_worker.client import build_envelope
from async_task_api_worker.definition import Worker
from async_task_api_worker.errors import ReportEncodeError, TargetError
from async_task_api_worker.observability.logging import configure_logging
from async_task_api_worker.runtime.exit_codes import ExitCode, say_error
from async_task_api_worker.runtime.runner import Runner, RunnerState
from async_task_api_worker.runtime.signals import (
    SUPERVISOR_GONE,
    drain_once_on,
    shutdown_on_signals,
)
from async_task_api_worker.settings import WorkerSettings, load_settings
from async_task_api_worker.transports.memory import InMemoryTransport, PublishedReport

__all__ = ["dev_command"]


class _ReportPrinter:
    """Prints each confirmed report as one line; stops everything if stdout goes away."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()

    def __call__(self, published: PublishedReport) -> None:
        if self.closed.is_set():
            return
        try:
            sys.stdout.write(published.report.body.decode("utf-8", "surrogateescape") + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            # `dev ... | head`: the reader is gone. Nothing more can be shown, so stop, and keep
            # the interpreter's final flush from failing on the dead pipe.
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            self.closed.set()


async def _serve(worker: Worker, settings: WorkerSettings, source: IO[str]) -> int:
    printer = _ReportPrinter()
    transport = InMemoryTransport(
        prefetch=settings.worker_concurrency,
        on_publish=printer,
        max_body_bytes=settings.worker_max_message_bytes,
    )
    runner = Runner(worker, settings, transport)
    lines = _read_lines(source)
    with shutdown_on_signals(runner.request_shutdown):
        serving = asyncio.ensure_future(runner.serve())
        refused: list[int] = []  # one entry per refused line, also when the input is cut short
        reading = asyncio.ensure_future(_feed(worker, transport, lines, refused))
        closed = asyncio.ensure_future(printer.closed.wait())
        # Whichever comes first: the input ends, stdout goes away, or a signal stops the runner.
        await asyncio.wait({reading, closed, serving}, return_when=asyncio.FIRST_COMPLETED)
        if not reading.done():
            reading.cancel()
            _stop(runner, printer, "the input was cut short")
            code = await serving
            closed.cancel()
            _say_unstarted(transport)
            return ExitCode.FAILURE if refused and code is ExitCode.OK else int(code)
        joined = asyncio.ensure_future(transport.join())
        await asyncio.wait({joined, closed, serving}, return_when=asyncio.FIRST_COMPLETED)
        joined.cancel()
        closed.cancel()
        _stop(runner, printer, "the input ended")
        code = await serving
        _say_unstarted(transport)
    return ExitCode.FAILURE if refused and code is ExitCode.OK else int(code)


def _stop(runner: Runner, printer: _ReportPrinter, why: str) -> None:
    """Stop ``runner``, at once when stdout is gone (nobody sees the reports any more).

    Else with its grace period, unless a signal asked already (a second request would end it).
    """
    if printer.closed.is_set():
        runner.request_shutdown("stdout closed")
        runner.request_shutdown("stdout closed")  # no grace: nobody sees the reports
    elif runner.state is RunnerState.RUNNING:
        runner.request_shutdown(why)


def _say_unstarted(transport: InMemoryTransport) -> None:
    # The embedded broker lives in this process: what it still holds goes with it.
    if transport.ready_count:
        print(
            f"{transport.ready_count} task(s) never started: the embedded broker keeps "
            "nothing once dev stops",
            file=sys.stderr,
        )


def _read_lines(source: IO[str]) -> asyncio.Queue[str | None]:
    """The lines of ``source``, then ``None``.

    A regular file never blocks: it is read at once, so every task of it is queued before the
    first one can report. Anything else (a pipe, a terminal) is read on a daemon thread: a
    blocked stdin must not hold the process open.
    """
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    if _is_regular_file(source):
        for line in source:
            lines.put_nowait(line)
        lines.put_nowait(None)
        return lines

    def read() -> None:
        # The loop may be gone (dev stopped early) or the file closed under us: end quietly.
        with contextlib.suppress(RuntimeError, ValueError, OSError):
            try:
                for line in iter(source.readline, ""):
                    loop.call_soon_threadsafe(lines.put_nowait, line)
            finally:  # an unreadable input ends the input: dev must not wait for more
                loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read, name="dev-input", daemon=True).start()
    return lines


def _is_regular_file(source: IO[str]) -> bool:
    try:
        return stat.S_ISREG(os.fstat(source.fileno()).st_mode)
    except (OSError, ValueError):  # no descriptor (a StringIO) or a closed one
        return False


async def _feed(
    worker: Worker,
    transport: InMemoryTransport,
    lines: asyncio.Queue[str | None],
    refused: list[int],
) -> None:
    """Queue one task per input line; each refused line's number goes on ``refused``."""
    number = 0
    while (line := await lines.get()) is not None:
        number += 1
        if not line.strip():
            continue
        try:
            task_input = json_object(line, f"line {number}")
            _, body = build_envelope(
                task_input, service=worker.name, task_id=f"dev-{number}", client_id="dev"
            )
        except (TargetError, ReportEncodeError) as exc:
            refused.append(number)
            print(f"{exc}; the line is skipped (a task input is a JSON object)", file=sys.stderr)
            continue
        transport.put(body)


def dev_command(target: str, path: str, *, flags: Mapping[str, str] | None = None) -> int:
    """Run ``target`` on the in-memory broker over the task inputs of ``path`` (``-``: stdin).

    ``flags`` are the setting flags' values by field name; they win over the environment.

    Returns:
        0 when every line was a task input and every task was settled (whatever its outcome),
        1 if a line was refused.

    Raises:
        ConfigError: the target, its definition or a setting is wrong (the caller exits 2).
    """
    settings = readable(load_settings(flags))
    _follow_the_reloader()
    worker = load_target(target, settings, stream=sys.stderr)
    # stdout carries the reports
    configure_logging(settings.log_level, log_format=settings.log_format, stream=sys.stderr)
    if path == "-":
        return asyncio.run(_serve(worker, settings, sys.stdin))
    try:
        # A byte that is not UTF-8 makes its line not JSON (refused, skipped), not an error.
        source = open(path, encoding="utf-8", errors="surrogateescape")  # noqa: SIM115 - closed below
    except OSError as exc:
        say_error(f"cannot read {path}: {exc.strerror}")
        return ExitCode.CONFIG
    with source:
        return asyncio.run(_serve(worker, settings, source))


def _follow_the_reloader() -> None:
    """Under ``dev --reload``: drain when the reloader dies, as a supervised process does."""
    from async_task_api_worker.cli.commands.reload import RELOADER_ENV
    from async_task_api_worker.executors.process.group import die_with_parent

    reloader = os.environ.pop(RELOADER_ENV, None)
    if reloader is None:
        return
    drain_once_on(SUPERVISOR_GONE)
    die_with_parent(SUPERVISOR_GONE)
    if str(os.getppid()) != reloader:  # it died before the request took hold
        raise SystemExit(ExitCode.OK)
