"""``cancel TASK_ID --service NAME [--client-id ID]``: ask a service's workers to cancel a task.

Publishes one cancel request (docs/protocol.md, "Cancelling a task") to the service's control
exchange, reading ``BROKER_URL`` and ``CONTROL_EXCHANGE_NAME`` as the worker does, and prints
one line once the broker confirmed it. It neither declares nor reads the worker's queues: the
task's outcome (``failure`` ``TASK_CANCELLED``, or whatever it concluded with first) arrives on
the output queue as usual. Exits 0 once confirmed, 1 when the broker was unreachable or did not
confirm, 2 for a usage error (an id or a service name outside its pattern, an invalid setting)
or a broker refusing the credentials, the vhost or the exchange, 130 when interrupted.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Mapping

from async_task_api_worker.cli.inputs import readable
from async_task_api_worker.client import TaskClient
from async_task_api_worker.errors import TargetError, TransportError
from async_task_api_worker.observability import tracing
from async_task_api_worker.observability.logging import configure_logging
from async_task_api_worker.protocol.envelope import ID_PATTERN, SERVICE_PATTERN
from async_task_api_worker.runtime.exit_codes import ExitCode, say_error
from async_task_api_worker.settings import load_settings

__all__ = ["cancel_command"]


def _check(value: str, pattern: str, what: str) -> None:
    """Refuse ``value`` unless it matches ``pattern``, naming ``what`` and the rule.

    Raises:
        TargetError: it does not (exit 2).
    """
    if not re.fullmatch(pattern, value):
        raise TargetError(f"{what} {value!r} does not match {pattern} (docs/protocol.md)")


async def _cancel(client: TaskClient, task_id: str) -> bool:
    # No report is awaited, so no queue is declared or consumed: a cancel must not hold (and
    # give back, counted as deliveries) reports that other clients wait for.
    await client.connect(reports=False)
    try:
        return await client.cancel(task_id)
    finally:
        await client.close()


def cancel_command(
    task_id: str, *, service: str, client_id: str, flags: Mapping[str, str] | None = None
) -> int:
    """Publish a cancel request for ``task_id`` to the workers of ``service``.

    Prints ``cancel requested for TASK_ID (service NAME, exchange X)`` on stdout once the broker
    confirmed the request; that says nothing of the task's outcome.

    Returns:
        0 when the broker confirmed the request, 1 when it was unreachable or did not confirm.

    Raises:
        ConfigError: the task id, the client id or the service name breaks its pattern, a
            setting is invalid, or the broker refused the credentials, the vhost or the
            exchange (exit 2); nothing was published then.
    """
    _check(task_id, ID_PATTERN, "task id")
    _check(client_id, ID_PATTERN, "--client-id")
    _check(service, SERVICE_PATTERN, "--service")
    settings = readable(load_settings(flags))  # flags: --broker-url
    # The broker client's lines (one per connection retry) go to stderr: stdout has the result.
    configure_logging(settings.log_level, log_format=settings.log_format, stream=sys.stderr)
    tracing.provider_from_env(sys.stderr)  # OTEL_*: the cancel's `send` span
    client = TaskClient.from_settings(service=service, settings=settings, client_id=client_id)
    try:
        reached = asyncio.run(_cancel(client, task_id))
    except TransportError as exc:  # unreachable, or not confirmed
        say_error(exc)
        return ExitCode.FAILURE
    print(f"cancel requested for {task_id} (service {service}, exchange {client.control_exchange})")
    if not reached:
        print(
            f"async-task-api-worker: warning: no worker is bound to {client.control_exchange}: "
            f"the request reached nobody (a wrong --service, or no worker running or "
            f"connected now)",
            file=sys.stderr,
        )
    return ExitCode.OK
