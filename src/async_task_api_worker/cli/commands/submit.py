"""``submit INPUT_JSON`` or ``submit --file TASKS`` (``--service NAME``): publish, print reports.

INPUT_JSON is one task's input; TASKS holds one a line (``-``: stdin), blank lines skipped.
Reads ``BROKER_URL``, ``IN_QUEUE_NAME`` and ``OUT_QUEUE_NAME`` as the worker does. Every task is
checked before anything is published: its input must be a JSON object and its envelope one the
worker accepts, else the command exits 2 naming the line. All the tasks share one
:class:`~async_task_api_worker.client.TaskClient`, hence one consumer of the output queue: a
report of one task is never given back for another (docs/clients.md). Each report is
printed as it arrives, a task's reports in their order. Exits 0 when every task succeeded, 1
when any failed (or had no terminal report within ``--timeout-s``, or the broker was
unreachable), 2 for a usage error or a broker refusing the credentials or the vhost, 130 when
interrupted.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence

from async_task_api_worker.cli.inputs import json_object, readable, report_line
from async_task_api_worker.client import TaskClient, build_envelope
from async_task_api_worker.errors import (
    EnvelopeDecodeError,
    ReportEncodeError,
    TargetError,
    TransportError,
)
from async_task_api_worker.observability import tracing
from async_task_api_worker.observability.logging import configure_logging
from async_task_api_worker.protocol.envelope import decode_envelope
from async_task_api_worker.protocol.reports import FailureReport, SuccessReport
from async_task_api_worker.runtime.exit_codes import ExitCode, say_error
from async_task_api_worker.settings import load_settings

__all__ = ["submit_command"]

#: A task to publish: its id (chosen before publishing, so that its reports are expected from
#: the start) and its input.
_Task = tuple[str, dict[str, object]]


def _checked(
    what_and_input: tuple[str, dict[str, object]],
    *,
    service: str,
    client_id: str,
    task_id: str | None,
    input_refs: Sequence[dict[str, object]],
) -> _Task:
    """``(task id, task_input)``, the envelope checked as the worker will check it.

    The task id is a new UUID unless given; ``what`` names the task in the error.

    Raises:
        TargetError: the worker would refuse the envelope (exit 2).
    """
    what, task_input = what_and_input
    # A bad task id or input reference is a usage error here, not a poison message there
    # (with no report, for a bad task id).
    try:
        task_id, body = build_envelope(
            task_input, service=service, task_id=task_id, client_id=client_id, input_refs=input_refs
        )
        decode_envelope(body)
    except (EnvelopeDecodeError, ReportEncodeError) as exc:
        raise TargetError(f"{what} would be refused by the worker: {exc}") from None
    return task_id, task_input


def _file_inputs(path: str) -> list[tuple[str, dict[str, object]]]:
    """``(where, task input)`` of each line of ``path`` (``-``: stdin) but blank ones.

    Raises:
        TargetError: the file cannot be read, holds no task, or a line is not a JSON object.
    """
    try:
        if path == "-":
            lines = sys.stdin.readlines()
        else:
            with open(path, encoding="utf-8") as source:
                lines = source.readlines()
    except OSError as exc:
        raise TargetError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:  # UnicodeDecodeError
        raise TargetError(f"cannot read {path}: {exc}") from None
    inputs = [
        (f"{path} line {number}", json_object(line, f"{path} line {number}"))
        for number, line in enumerate(lines, start=1)
        if line.strip()
    ]
    if not inputs:
        raise TargetError(f"{path} holds no task input")
    return inputs


async def _print_reports(client: TaskClient, task_id: str, succeeded: dict[str, bool]) -> None:
    async for report in client.reports(task_id):
        print(report_line(report))
        sys.stdout.flush()
        if isinstance(report, SuccessReport | FailureReport):  # its last: the task ended
            succeeded[task_id] = isinstance(report, SuccessReport)


async def _submit(
    client: TaskClient,
    tasks: Sequence[_Task],
    *,
    client_id: str,
    input_refs: Sequence[dict[str, object]],
    succeeded: dict[str, bool],
) -> None:
    """Publish ``tasks`` in order and print their reports until each task's terminal one.

    ``succeeded`` gets each task id whose terminal report came, with whether it was a success.
    """
    async with client:
        printers: list[asyncio.Task[None]] = []
        try:
            for task_id, task_input in tasks:
                await client.submit(
                    task_input, task_id=task_id, client_id=client_id, input_refs=input_refs
                )
                print(f"submitted task {task_id}", file=sys.stderr)
                printers.append(asyncio.ensure_future(_print_reports(client, task_id, succeeded)))
            await asyncio.gather(*printers)
        finally:
            for printer in printers:
                printer.cancel()
            await asyncio.gather(*printers, return_exceptions=True)


def submit_command(
    raw_input: str | None,
    *,
    file: str | None = None,
    service: str,
    client_id: str,
    task_id: str | None,
    input_refs: Sequence[str],
    timeout_s: float | None,
    flags: Mapping[str, str] | None = None,
) -> int:
    """Publish one task (``raw_input``) or one a line of ``file``, and print their reports.

    Each report is printed as one JSON object per line, until each task's terminal report.

    Returns:
        0 when every task succeeded, 1 when any failed, had no terminal report within
        ``timeout_s`` seconds (the whole run's bound), or the broker was unreachable.

    Raises:
        ConfigError: an input, an input reference, an option or a setting is invalid, or the
            broker refused the credentials, the vhost or a queue (exit 2); nothing was
            published then.
    """
    if (raw_input is None) == (file is None):
        raise TargetError("give one task input or --file, not both")
    if file is not None and (task_id is not None or input_refs):
        raise TargetError("--task-id and --input-ref go with one task input, not with --file")
    if timeout_s is not None and not timeout_s > 0:
        raise TargetError("--timeout-s must be a positive number of seconds")
    refs = [json_object(ref, "--input-ref") for ref in input_refs]
    inputs = (
        [("this task", json_object(raw_input, "the task input"))]
        if raw_input is not None
        else _file_inputs(file or "-")
    )
    tasks = [
        _checked(what, service=service, client_id=client_id, task_id=task_id, input_refs=refs)
        for what in inputs
    ]
    settings = readable(load_settings(flags))  # flags: --broker-url
    # The broker client's lines and ours, one per retry, on stderr: stdout carries the reports.
    configure_logging(settings.log_level, log_format=settings.log_format, stream=sys.stderr)
    tracing.provider_from_env(sys.stderr)  # OTEL_*: the `send` span, its context in the envelope
    client = TaskClient.from_settings(service=service, settings=settings)
    succeeded: dict[str, bool] = {}

    async def bounded() -> None:
        run = _submit(client, tasks, client_id=client_id, input_refs=refs, succeeded=succeeded)
        await asyncio.wait_for(run, timeout=timeout_s)

    try:
        asyncio.run(bounded())
    except TimeoutError:
        missing = len(tasks) - len(succeeded)
        print(
            f"no terminal report within {timeout_s:g} s for {missing} of {len(tasks)} task(s)",
            file=sys.stderr,
        )
        return ExitCode.FAILURE
    except TransportError as exc:  # unreachable, unconfirmed, or queues not set up
        say_error(exc)
        return ExitCode.FAILURE
    return ExitCode.OK if all(succeeded.values()) else ExitCode.FAILURE
