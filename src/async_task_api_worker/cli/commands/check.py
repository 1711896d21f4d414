"""``check my_module:worker``: the definition, the settings and the time budget, no broker.

Prints what a deployment needs: the transport, the effective task timeout, the budget
arithmetic, the worker processes, the shutdown bound and the ``terminationGracePeriodSeconds``
to set. Exits 0, or 2 with one line.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping

from async_task_api_worker.cli.loading import load_target
from async_task_api_worker.errors import TimeBudgetError
from async_task_api_worker.runtime.entry import shutdown_bounds
from async_task_api_worker.runtime.exit_codes import ExitCode
from async_task_api_worker.runtime.hooks import close_timeout_s
from async_task_api_worker.runtime.loops import loop_factory
from async_task_api_worker.runtime.processes import KILL_MARGIN_S, shutdown_bound_of
from async_task_api_worker.settings import (
    SILENT_HEARTBEATS_TO_DEAD,
    WorkerSettings,
    WorkerTransport,
    check_time_budget,
    consumer_timeout_s,
    describe_time_budget,
    load_settings,
)
from async_task_api_worker.transports.rabbitmq.tls import describe_tls

__all__ = ["check_command"]

#: The longest ``stopTimeout`` ECS allows a container (Fargate and EC2 alike), in seconds.
ECS_MAX_STOP_TIMEOUT_S = 120


def check_command(target: str, *, flags: Mapping[str, str] | None = None) -> int:
    """Check ``target`` against the environment's settings and print the numbers.

    Args:
        target: ``my_module:worker``.
        flags: the setting flags' values by field name, as ``run`` takes them (they win over
            the environment).

    Raises:
        ConfigError: the target, its definition, a setting or the time budget is wrong (or
            ``WORKER_TRANSPORT=sqs-sfn`` without boto3).
    """
    settings = load_settings(flags)
    worker = load_target(target, settings, stream=sys.stderr)  # stdout is the report
    # The transport `run` would use is made (not connected): how it settles decides the grace.
    grace, process_bound_s = shutdown_bounds(worker, settings)
    count = settings.worker_processes
    bound_s = shutdown_bound_of(count, process_bound_s)
    task = worker.task_definition
    timeout_s = settings.task_timeout_s(task.timeout_s)
    hooks = settings.worker_shutdown_hooks_timeout_s
    isolation = ", a process per task" if task.isolation == "process" else ""
    print(
        f"worker {worker.name}: {task.kind.value} handler{isolation}, "
        f"{settings.worker_mode.value} mode"
    )
    if settings.worker_transport is WorkerTransport.SQS_SFN:
        _print_sqs_sfn(settings, timeout_s)
    else:
        _print_rabbitmq(settings, timeout_s)
    close_s = close_timeout_s(settings)
    # The close's share, as runtime.hooks.close_timeout_s decides it (a long poll on SQS).
    close = f"{close_s:g} s close" + (
        f" (5 s + {close_s - 5:g} s long poll)" if close_s > 5 else ""
    )
    if count == 1:
        print("processes: 1 (--processes / WORKER_PROCESSES)")
    else:
        print(
            f"processes: {count} (--processes / WORKER_PROCESSES) under a supervisor, each with "
            f"its own broker connection: up to {count * settings.worker_concurrency} tasks at once "
            f"({count} x WORKER_CONCURRENCY {settings.worker_concurrency})"
        )
    process_sum = (
        f"max(grace {grace:g} s, 5) + 5 s give-backs + {close} + {hooks:g} s shutdown hooks + 2 s"
    )
    if count == 1:
        print(f"shutdown bound: {bound_s:g} s after SIGTERM ({process_sum})")
    else:
        print(
            f"shutdown bound: {bound_s:g} s after SIGTERM (a process's {process_bound_s:g} s: "
            f"{process_sum}; + {KILL_MARGIN_S:g} s for the supervisor to kill and reap what is "
            "left)"
        )
    print(f"terminationGracePeriodSeconds: {math.ceil(bound_s) + 1}")
    if settings.worker_transport is WorkerTransport.SQS_SFN:
        stop_s = math.ceil(bound_s) + 1
        print(
            f"ECS stopTimeout: {min(stop_s, ECS_MAX_STOP_TIMEOUT_S)}"
            + (
                f" (ECS allows {ECS_MAX_STOP_TIMEOUT_S} s at most: a longer drain is cut by "
                "SIGKILL, and Step Functions sees a heartbeat timeout)"
                if stop_s > ECS_MAX_STOP_TIMEOUT_S
                else ""
            )
        )
    uses_uvloop = loop_factory(settings.worker_event_loop) is not None
    print(
        f"event loop: {'uvloop' if uses_uvloop else 'asyncio'} "
        f"(WORKER_EVENT_LOOP={settings.worker_event_loop.value})"
    )
    return ExitCode.OK


def _print_rabbitmq(settings: WorkerSettings, timeout_s: float) -> None:
    urls = settings.broker_urls()
    print("transport: rabbitmq (WORKER_TRANSPORT)")
    print(
        f"broker: {len(urls)} URL{'s' if len(urls) > 1 else ''}, heartbeat "
        f"{settings.broker_heartbeat_s} s (a connection silent for "
        f"{SILENT_HEARTBEATS_TO_DEAD * settings.broker_heartbeat_s} s is taken for dead)"
    )
    for position, url in enumerate(urls, start=1):
        which = f"URL {position}" if len(urls) > 1 else "the URL"
        print(f"  {which}: {describe_tls(url)}")
    print(f"time budget: {describe_time_budget(settings, timeout_s)}")
    own_s = consumer_timeout_s(settings, timeout_s)
    print(
        f"  on RabbitMQ 4.3+, a quorum queue: the worker asks for a consumer timeout of "
        f"{own_s:g} s (x-consumer-timeout); a classic queue has none"
    )
    try:
        check_time_budget(settings, timeout_s)  # the effective timeout: the same again
        older = f"under WORKER_CONSUMER_TIMEOUT_S {settings.worker_consumer_timeout_s:g} s: ok"
    except TimeBudgetError as exc:
        older = f"the worker does not start: {exc}"
    print(f"  on RabbitMQ before 4.3 (its own consumer timeout): {older}")
    print(
        f"a report that cannot get out holds its delivery for up to "
        f"{settings.delivery_hold_s(timeout_s):g} s from its arrival, then gives it back"
    )
    print(f"largest report: {settings.worker_max_report_bytes} bytes (WORKER_MAX_REPORT_BYTES)")


def _print_sqs_sfn(settings: WorkerSettings, timeout_s: float) -> None:
    # Late: the package needs boto3, which transport_for found already.
    from async_task_api_worker.transports.sqs_sfn import protection_minutes
    from async_task_api_worker.transports.sqs_sfn.codec import MAX_OUTPUT_BYTES

    print(
        f"transport: sqs-sfn ({settings.sqs_queue_url}, a heartbeat every "
        f"{settings.sfn_heartbeat_interval_s:g} s, long poll {settings.sqs_wait_time_s} s); "
        "Step Functions is the only retry source: every delivery is attempt 1/1"
    )
    print(
        f"task timeout {timeout_s:g} s; ECS task protection {protection_minutes(timeout_s)} min "
        "at a time while a message is in hand (no consumer timeout: heartbeats keep a token alive)"
    )
    print(
        f"a report Step Functions does not take is held for up to "
        f"{settings.delivery_hold_s(timeout_s):g} "
        "s, then the task is handed back (error TASK_GIVEN_BACK)"
    )
    print(f"largest output: {MAX_OUTPUT_BYTES} bytes (Step Functions' limit)")
