"""``submit INPUT_JSON --service NAME``: publish one task, print its reports until the last.

Reads ``BROKER_URL``, ``IN_QUEUE_NAME`` and ``OUT_QUEUE_NAME`` as the worker does. Exits 0 when
the task succeeded, 1 when it failed (or no terminal report came within ``--timeout-s``, or the
broker was unreachable), 2 for a usage error (checked before anything is published), 130 when
interrupted.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence

from async_task_api_worker.client import TaskClient, build_envelope
from async_task_api_worker.errors import (
    BrokerUnavailableError,
    EnvelopeDecodeError,
    PublishError,
    ReportEncodeError,
    TargetError,
)
from async_task_api_worker.protocol.encoding import canonical_dumps
from async_task_api_worker.protocol.envelope import decode_envelope
from async_task_api_worker.protocol.reports import SuccessReport
from async_task_api_worker.runtime.exit_codes import ExitCode
from async_task_api_worker.settings import load_settings

__all__ = ["submit_command"]


def _json_object(text: str, what: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise TargetError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise TargetError(f"{what} must be a JSON object")
    return value


async def _submit(
    client: TaskClient,
    task_input: dict[str, object],
    *,
    client_id: str,
    task_id: str | None,
    input_refs: Sequence[dict[str, object]],
) -> int:
    async with client:
        task_id = await client.submit(
            task_input, task_id=task_id, client_id=client_id, input_refs=input_refs
        )
        print(f"submitted task {task_id}", file=sys.stderr)
        async for report in client.reports(task_id):
            print(canonical_dumps(report.model_dump()).decode("utf-8", "surrogateescape"))
            sys.stdout.flush()
            if isinstance(report, SuccessReport):
                return ExitCode.OK
    return ExitCode.FAILURE


def submit_command(
    raw_input: str,
    *,
    service: str,
    client_id: str,
    task_id: str | None,
    input_refs: Sequence[str],
    timeout_s: float | None,
) -> int:
    """Publish one task and print its reports, one JSON object per line.

    Raises:
        ConfigError: the input, an input reference or a setting is invalid (exit 2).
    """
    task_input = _json_object(raw_input, "the task input")
    refs = [_json_object(ref, "--input-ref") for ref in input_refs]
    if timeout_s is not None and not timeout_s > 0:
        raise TargetError("--timeout-s must be a positive number of seconds")
    # Check the envelope as the worker will, so that a bad task id or input reference is a
    # usage error here, not a poison message there (with no report, for a bad task id).
    try:
        _, body = build_envelope(
            task_input, service=service, task_id=task_id, client_id=client_id, input_refs=refs
        )
        decode_envelope(body)
    except (EnvelopeDecodeError, ReportEncodeError) as exc:
        raise TargetError(f"this task would be refused by the worker: {exc}") from None
    client = TaskClient.from_settings(service=service, settings=load_settings())

    async def bounded() -> int:
        return await asyncio.wait_for(
            _submit(client, task_input, client_id=client_id, task_id=task_id, input_refs=refs),
            timeout=timeout_s,
        )

    try:
        return asyncio.run(bounded())
    except TimeoutError:
        print(f"no terminal report within {timeout_s:g} s", file=sys.stderr)
        return ExitCode.FAILURE
    except (BrokerUnavailableError, PublishError) as exc:
        print(f"async-task-api-worker: {exc}", file=sys.stderr)
        return ExitCode.FAILURE
