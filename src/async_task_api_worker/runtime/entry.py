"""Running a worker from code (``worker.run()``, ``await worker.serve()``) or the CLI.

Startup order (seed, "Running a worker"): the settings are read and validated before any
connection, and RabbitMQ's time budget as soon as the broker's version is known; an invalid
configuration exits 2 with one line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

from async_task_api_worker.definition import Worker
from async_task_api_worker.errors import ConfigError, SettingsError, TimeBudgetError, TransportError
from async_task_api_worker.observability.logging import configure_logging
from async_task_api_worker.ports import Transport
from async_task_api_worker.runtime.exit_codes import ExitCode, say_error
from async_task_api_worker.runtime.hooks import STUCK_CHECK_S, drain_grace_s, shutdown_bound_s
from async_task_api_worker.runtime.loops import loop_factory, run_on
from async_task_api_worker.runtime.observed import serving_probes
from async_task_api_worker.runtime.runner import Runner
from async_task_api_worker.runtime.signals import shutdown_on_signals
from async_task_api_worker.runtime.threads import TaskAwareExecutor
from async_task_api_worker.settings import (
    WorkerMode,
    WorkerSettings,
    WorkerTransport,
    check_time_budget,
    consumer_timeout_s,
    load_settings,
)

__all__ = [
    "check_worker",
    "prepare",
    "run_worker",
    "runner_for",
    "serve_worker",
    "shutdown_bounds",
    "transport_for",
]

_logger = logging.getLogger("async_task_api_worker.runtime")


def prepare(worker: Worker, overrides: Mapping[str, Any] | None = None) -> WorkerSettings:
    """Load the settings and check the worker against them, before any connection.

    Args:
        worker: the worker.
        overrides: field values that win over the environment (a command line's flags).

    Raises:
        SettingsError: a setting is invalid (``TimeBudgetError``: the time budget fails on
            RabbitMQ), or ``WORKER_EVENT_LOOP=uvloop`` without uvloop installed.
        NoTaskError: the worker has no task.
    """
    return check_worker(worker, load_settings(overrides))


def check_worker(worker: Worker, settings: WorkerSettings) -> WorkerSettings:
    """Check ``worker`` against ``settings`` loaded already (:func:`prepare`'s second half).

    Returns:
        ``settings``.

    Raises:
        SettingsError: as :func:`prepare`, but for the loading.
        NoTaskError: the worker has no task.
    """
    # RabbitMQ's time budget is checked once the broker's version is known, by the transport's
    # connect: from 4.3 the worker sets its own consumer timeout (``transport_for``).
    loop_factory(settings.worker_event_loop)  # WORKER_EVENT_LOOP=uvloop needs uvloop installed
    return settings


def transport_for(worker: Worker, settings: WorkerSettings, **options: Any) -> Transport:
    """The transport ``WORKER_TRANSPORT`` names, for ``worker``; nothing is connected yet.

    Job mode takes one delivery at a time, whatever ``WORKER_CONCURRENCY`` says (which then only
    sizes the handler slots and the thread pool), and gives up connecting in time.

    Args:
        worker: the worker.
        settings: its settings.
        **options: more arguments for the SQS + Step Functions transport (the seed-000 face:
            its clients, its error names).

    Raises:
        SettingsError: ``WORKER_TRANSPORT=sqs-sfn`` without boto3 installed (the ``aws`` extra).
    """
    job = settings.worker_mode is WorkerMode.JOB
    prefetch = 1 if job else settings.worker_concurrency
    connect_timeout_s = settings.worker_job_connect_timeout_s if job else None
    if settings.worker_transport is WorkerTransport.SQS_SFN:
        try:
            from async_task_api_worker.transports.sqs_sfn import (
                SqsSfnTransport,
                protection_minutes,
            )
        except ImportError as exc:
            raise SettingsError(
                "invalid setting WORKER_TRANSPORT: sqs-sfn needs boto3 (the SDK's `aws` extra)"
            ) from exc
        assert settings.sqs_queue_url is not None  # noqa: S101 - the settings require it
        timeout_s = settings.task_timeout_s(worker.task_definition.timeout_s)
        return SqsSfnTransport(
            queue_url=settings.sqs_queue_url,
            service=worker.name,
            prefetch=prefetch,
            heartbeat_interval_s=settings.sfn_heartbeat_interval_s,
            protection_minutes=protection_minutes(timeout_s),
            wait_time_s=settings.sqs_wait_time_s,
            max_body_bytes=settings.worker_max_message_bytes,
            connect_timeout_s=connect_timeout_s,
            **options,
        )
    from async_task_api_worker.transports.rabbitmq import RabbitMQTransport

    timeout_s = settings.task_timeout_s(worker.task_definition.timeout_s)
    budget_error: TimeBudgetError | None = None
    try:
        check_time_budget(settings, worker.task_definition.timeout_s)
    except TimeBudgetError as exc:  # raised by connect() on a broker before 4.3
        budget_error = exc
    return RabbitMQTransport(
        urls=settings.broker_urls(),
        in_queue=settings.in_queue(worker.name),
        out_queue=settings.out_queue(worker.name),
        prefetch=prefetch,
        service=worker.name,
        heartbeat_s=settings.broker_heartbeat_s,
        connect_timeout_s=connect_timeout_s,
        control_exchange=settings.control_exchange(worker.name),
        max_body_bytes=settings.worker_max_message_bytes,
        consumer_timeout_s=consumer_timeout_s(settings, timeout_s),
        time_budget_error=budget_error,
    )


def runner_for(worker: Worker, settings: WorkerSettings) -> Runner:
    """A runner for ``worker`` on the transport ``WORKER_TRANSPORT`` names."""
    return Runner(worker, settings, transport_for(worker, settings))


def shutdown_bounds(worker: Worker, settings: WorkerSettings) -> tuple[float, float]:
    """The drain's grace and the shutdown bound of one worker process, in seconds.

    The grace is ``runtime.hooks.drain_grace_s`` for the transport ``run`` builds (made, not
    connected, so that its configuration errors are raised here too), the bound
    ``runtime.hooks.shutdown_bound_s`` with that grace: what ``check`` prints, and what a
    supervisor of several processes adds its margin to.

    Raises:
        SettingsError: ``WORKER_TRANSPORT=sqs-sfn`` without boto3 installed.
    """
    transport_for(worker, settings)  # its configuration errors, as ``run`` would raise them
    timeout_s = settings.task_timeout_s(worker.task_definition.timeout_s)
    grace_s = drain_grace_s(settings, timeout_s)
    return grace_s, shutdown_bound_s(settings, grace_s=grace_s)


def _one_process(settings: WorkerSettings) -> None:
    """Refuse ``WORKER_PROCESSES`` above 1 where no supervisor can start the others."""
    if settings.worker_processes > 1:
        # Only the `run` command knows the target a fresh process can load.
        raise SettingsError(
            f"invalid setting WORKER_PROCESSES: {settings.worker_processes} processes need the "
            "run command (async-task-api-worker run my_module:worker); worker.run() and "
            "serve() run one"
        )


async def serve_worker(worker: Worker, settings: WorkerSettings | None = None) -> None:
    """Serve ``worker`` from the running event loop until cancelled or the transport gives up.

    Installs no signal handler (the application owns them); cancel the calling task to stop:
    the worker drains as on SIGTERM, then the cancel propagates.

    The probes server (``/health``, ``/ready``, ``/metrics``) runs for as long as the worker.

    Raises:
        SettingsError: a setting is invalid, checked before connecting (or the probes server
            cannot listen on ``HEALTH_CHECK_HOST:HEALTH_CHECK_PORT``, or ``WORKER_PROCESSES``
            is above 1: only the ``run`` command starts several processes).
        BrokerRefusedError: the broker refused the connection.
        BrokerUnavailableError: the transport gave up.
    """
    settings = settings or prepare(worker)
    _one_process(settings)
    runner = runner_for(worker, settings)
    async with serving_probes(runner):
        serving = asyncio.ensure_future(runner.serve())
        try:
            code = await asyncio.shield(serving)
        except asyncio.CancelledError:
            runner.request_shutdown("the serving task was cancelled")
            await serving
            raise
    # A handler still stuck after the drain is logged, and left to the application: unlike
    # `run`, serve() must not end the process.
    if code is not ExitCode.OK and runner.failure is not None:
        raise runner.failure


async def _run(runner: Runner, probes_socket: socket.socket | None) -> ExitCode:
    loop = asyncio.get_running_loop()
    _logger.info(
        "Event loop: %s (WORKER_EVENT_LOOP=%s)",
        type(loop).__module__.partition(".")[0],
        runner.settings.worker_event_loop.value,
    )
    async with serving_probes(runner, sock=probes_socket) as probes:
        code = await _run_observed(runner)
    _logger.info("Worker stopped (exit code %d)", code)
    if probes.readiness.stuck_probes:
        # asyncio would wait for them forever on the way out, past the shutdown bound.
        _logger.error(
            "%d readiness probe hook(s) ignored their cancel and still run; exiting now",
            probes.readiness.stuck_probes,
        )
        logging.shutdown()
        os._exit(code)
    return code


async def _run_observed(runner: Runner) -> ExitCode:
    threads = TaskAwareExecutor()
    asyncio.get_running_loop().set_default_executor(threads)
    with shutdown_on_signals(runner.request_shutdown):
        code = await runner.serve()
    for task_id in await threads.wait_idle(STUCK_CHECK_S):
        _logger.error(
            "A thread started by the handler of task %s (asyncio.to_thread) is still running "
            "%g s after the drain and cannot be stopped",
            task_id,
            STUCK_CHECK_S,
            extra={"task_id": task_id},
        )
        code = ExitCode.FAILURE
    if code is ExitCode.FAILURE and (runner.stuck_task_ids or threads.running_task_ids()):
        # A thread cannot be stopped, and asyncio would wait for it forever on the way out:
        # the process ends here, at once, with 1 (seed, "Running a worker").
        logging.shutdown()
        os._exit(ExitCode.FAILURE)
    return code


def run_worker(
    worker: Worker,
    *,
    runner: Runner | None = None,
    build: Callable[[], Runner] | None = None,
    probes_socket: socket.socket | None = None,
) -> ExitCode:
    """Run ``worker`` until SIGTERM/SIGINT, in a new event loop; returns the exit code.

    The probes server runs from before the startup hooks to the end of the shutdown; logs are
    lines on stdout in ``LOG_FORMAT`` (unless the application configured logging first).

    Args:
        worker: the worker.
        runner: a runner made already (logging is then left as it is).
        build: makes the runner, for a face with a transport or executor of its own (the
            seed-000 ``sfn.Worker``); default: :func:`runner_for` on :func:`prepare`'s settings.
        probes_socket: the bound socket a supervisor gave this process for its probes, served
            instead of ``HEALTH_CHECK_HOST:PORT`` (``runtime.processes``).

    Errors become exit codes with one line on stderr: 2 for configuration (a bad setting, the
    time budget, refused credentials, a probes port that cannot be bound, ``WORKER_PROCESSES``
    above 1: only the ``run`` command starts several processes), 1 for a broker that cannot be
    reached or whose connection was cut while the queues were set up (the orchestrator starts
    the worker again).
    """
    try:
        if runner is None:
            runner = build() if build is not None else runner_for(worker, prepare(worker))
            configure_logging(runner.settings.log_level, log_format=runner.settings.log_format)
        _one_process(runner.settings)
        return run_on(runner.settings.worker_event_loop, _run(runner, probes_socket))
    except ConfigError as exc:
        say_error(exc)
        return ExitCode.CONFIG
    except TransportError as exc:
        say_error(exc)
        return ExitCode.FAILURE
