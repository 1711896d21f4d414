"""``conformance --service NAME``: run the conformance battery against a running worker.

The worker under test (any language) serves the reference task of docs/conformance.md on the
broker of ``--broker-url`` (default ``BROKER_URL``; its first URL). The kit reads the worker's
variables for what it expects: ``IN_QUEUE_NAME``, ``OUT_QUEUE_NAME``, ``CONTROL_EXCHANGE_NAME``,
``WORKER_DELIVERY_LIMIT``, ``WORKER_PROGRESS_MIN_INTERVAL_S`` and ``WORKER_MAX_MESSAGE_BYTES``
(give the kit the values the worker runs with). It prints a table of the cases, writes JUnit
XML with ``--junit-xml``, and exits 0 when no case failed (with ``--strict``: none failed or
was skipped), 1 when one did (or the broker or the worker could not be reached), 2 for a usage
error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import shutil
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from async_task_api_worker.conformance.admin import Admin
from async_task_api_worker.conformance.battery import (
    Battery,
    Outcome,
    junit_xml,
    new_run_id,
    run_battery,
    table,
)
from async_task_api_worker.conformance.cases import Setup
from async_task_api_worker.protocol.envelope import SERVICE_PATTERN
from async_task_api_worker.runtime.exit_codes import ExitCode, say_error
from async_task_api_worker.settings import load_settings

__all__ = ["admin_for", "case_names", "conformance_command"]


def _vhost(url: str) -> str:
    path = urllib.parse.urlsplit(url).path
    return urllib.parse.unquote(path[1:]) if len(path) > 1 else "/"


def admin_for(url: str, rabbitmqctl: str | None) -> tuple[Admin | None, str]:
    """``rabbitmqctl`` for ``url``'s vhost (``--rabbitmqctl``: empty for none, else PATH's).

    Returns:
        ``(admin, "")``, or ``(None, why there is none)``.
    """
    if rabbitmqctl == "":
        return None, "--rabbitmqctl is empty"
    command = rabbitmqctl or shutil.which("rabbitmqctl")
    if command is None:
        return None, "rabbitmqctl is not on PATH (--rabbitmqctl names it)"
    return Admin(command, _vhost(url)), ""


def case_names(listed: str | None) -> tuple[str, ...]:
    """The case names of a comma-separated option (``--only``, ``--with``), blanks dropped."""
    return tuple(name.strip() for name in (listed or "").split(",") if name.strip())


@contextlib.contextmanager
def _quiet_broker_clients() -> Iterator[None]:
    """Silence aiormq's and aio-pika's own log lines (tracebacks of a closed connection).

    The kit says each such failure itself, in one line: a case fails or the run stops. The
    loggers' levels are restored after (the command may run inside another program).
    """
    loggers = [logging.getLogger(name) for name in ("aiormq", "aio_pika")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _usage_error(
    service: str, timeout_s: float, listed: tuple[tuple[str, str | None], ...]
) -> str | None:
    """The first usage error among the options (one line), or None."""
    if not re.fullmatch(SERVICE_PATTERN, service):
        return f"--service {service!r} does not match {SERVICE_PATTERN} (docs/protocol.md)"
    if math.isnan(timeout_s) or timeout_s <= 0:
        return "--timeout-s must be a positive number of seconds"
    for option, value in listed:
        # ``--only ,,`` would otherwise run every default case: the opposite of what was asked.
        if value is not None and not case_names(value):
            return f"{option} names no case (comma-separated case names)"
    return None


def conformance_command(
    *,
    service: str,
    broker_url: str | None,
    rabbitmqctl: str | None,
    only: str | None,
    junit: str | None,
    timeout_s: float,
    opt_in: str | None = None,
    strict: bool = False,
) -> int:
    """Run the battery; print the table; return the exit code (see the module).

    ``only`` and ``opt_in``: comma-separated case names (``--only``, ``--with``); ``strict``:
    a skipped case fails the run.
    """
    usage = _usage_error(service, timeout_s, (("--only", only), ("--with", opt_in)))
    if usage is not None:
        say_error(usage)
        return ExitCode.CONFIG
    values = {"broker_url": broker_url} if broker_url else {}
    settings = load_settings(values)  # a bad variable raises ConfigError: exit 2, one line
    url = settings.broker_urls()[0]
    admin, admin_missing = admin_for(url, rabbitmqctl)
    battery = Battery(
        url=url,
        in_queue=settings.in_queue(service),
        out_queue=settings.out_queue(service),
        setup=Setup(
            service=service,
            delivery_limit=settings.worker_delivery_limit,
            progress_interval_s=settings.worker_progress_min_interval_s,
            max_message_bytes=settings.worker_max_message_bytes,
            run_id=new_run_id(),
            admin=admin,
            admin_missing=admin_missing,
            broker_url=url,
            control_exchange=settings.control_exchange(service),
        ),
        timeout_s=timeout_s,
        only=case_names(only),
        opt_in=case_names(opt_in),
        strict=strict,
    )
    try:
        battery.cases()
    except ValueError as exc:
        say_error(exc)
        return ExitCode.CONFIG
    print(
        f"conformance: service {service!r}, queues {battery.in_queue} -> {battery.out_queue}, "
        f"run {battery.setup.run_id}{', strict' if strict else ''}",
        flush=True,
    )
    try:
        with _quiet_broker_clients():
            verdicts = asyncio.run(run_battery(battery))
    except (ConnectionError, LookupError) as exc:
        say_error(exc)
        return ExitCode.FAILURE
    print(table(verdicts))
    if junit:
        Path(junit).write_bytes(junit_xml(verdicts))
    failed = any(verdict.outcome is Outcome.FAIL for verdict in verdicts)
    sys.stdout.flush()
    return ExitCode.FAILURE if failed else ExitCode.OK
