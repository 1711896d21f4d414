"""``inspect``, ``purge`` and ``reports`` (``--service NAME``): the operator's commands.

Each reads ``BROKER_URL`` (or ``--broker-url``), ``IN_QUEUE_NAME``, ``OUT_QUEUE_NAME`` and
``CONTROL_EXCHANGE_NAME`` as the worker does, and declares no queue (a misspelt service finds
none). docs/commands.md describes them, their output and their exits: 0 done, 1 the broker or a
queue failed (``inspect``: some worker did not answer), 2 a usage error or a refusal by the
broker, 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import re
import sys
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

from async_task_api_worker.cli.commands.conformance import admin_for
from async_task_api_worker.cli.commands.inspect_view import Inspected, render_json, render_table
from async_task_api_worker.cli.inputs import readable, report_line
from async_task_api_worker.cli.main import INTERRUPTED
from async_task_api_worker.conformance.admin import REAP_S, AdminError
from async_task_api_worker.errors import ProtocolError, TargetError, TransportError
from async_task_api_worker.observability.logging import configure_logging
from async_task_api_worker.protocol.envelope import SERVICE_PATTERN
from async_task_api_worker.protocol.inspect import decode_inspect_reply, encode_inspect_request
from async_task_api_worker.protocol.reports import decode_report
from async_task_api_worker.runtime.exit_codes import ExitCode, say_error
from async_task_api_worker.settings import WorkerSettings, load_settings
from async_task_api_worker.transports.rabbitmq.operations import CLOSE_S, Operator

__all__ = ["inspect_bound_s", "operator_command"]

#: How long ``purge`` and ``reports`` try to connect, in seconds.
CONNECT_S: Final = 10.0


def inspect_bound_s(timeout_s: float) -> float:
    """The longest ``inspect --timeout-s T`` runs once its settings are read, in seconds.

    Connecting, the workers' answers and ``rabbitmqctl`` all fit in ``T``; a ``rabbitmqctl``
    still running then is killed and reaped within
    :data:`~async_task_api_worker.conformance.admin.REAP_S`, and closing the connection takes
    at most :data:`~async_task_api_worker.transports.rabbitmq.operations.CLOSE_S` more.
    """
    return timeout_s + REAP_S + CLOSE_S


def operator_command(arguments: argparse.Namespace, *, flags: Mapping[str, str]) -> int:
    """Run ``inspect``, ``purge`` or ``reports`` for ``arguments.service``; the exit code.

    Raises:
        ConfigError: a bad option or setting, or the broker refused us (exit 2).
    """
    service = arguments.service
    if not re.fullmatch(SERVICE_PATTERN, service):
        raise TargetError(f"--service {service!r} does not match {SERVICE_PATTERN}")
    if arguments.command == "inspect" and not (
        math.isfinite(arguments.timeout_s) and arguments.timeout_s > 0
    ):
        raise TargetError("--timeout-s must be a positive number of seconds")
    if arguments.command == "purge" and not arguments.yes and not sys.stdin.isatty():
        raise TargetError("purge asks before it deletes: run it on a terminal, or give --yes")
    settings = readable(load_settings(flags))
    configure_logging(settings.log_level, log_format=settings.log_format, stream=sys.stderr)
    try:
        if arguments.command == "inspect":
            return _inspect(settings, service, arguments.timeout_s, arguments)
        if arguments.command == "purge":
            return _purge(settings, service, yes=arguments.yes)
        return _reports(settings, service, follow=arguments.follow)
    except TransportError as exc:
        say_error(exc)
        return ExitCode.FAILURE


# --- inspect -----------------------------------------------------------------------------------


def _inspect(
    settings: WorkerSettings, service: str, timeout_s: float, arguments: argparse.Namespace
) -> int:
    url = settings.broker_urls()[0]
    admin, admin_missing = admin_for(url, arguments.rabbitmqctl)
    in_queue = settings.in_queue(service)
    request_id = uuid.uuid4().hex
    body = encode_inspect_request(request_id, "cli", datetime.now(UTC))
    replies: list[bytes] = []
    found = Inspected(service=service, queue=in_queue, timeout_s=timeout_s)

    async def ask() -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_s
        operator = Operator(settings.broker_url.get_secret_value(), connect_timeout_s=timeout_s)
        listing: asyncio.Task[list[str]] | None = None
        try:
            async with asyncio.timeout_at(until):  # connecting counts against the bound too
                await operator.connect()
                found.consumers = (await operator.queue(in_queue)).consumers
            if admin is not None:
                listing = asyncio.ensure_future(admin.consumer_tags(in_queue))
            await operator.ask(
                settings.control_exchange(service),
                body,
                request_id=request_id,
                client_id="cli",
                until=until,
                on_reply=replies.append,
            )
        finally:
            if listing is not None:
                found.tags, found.tags_missing = await _listed(listing)
            await operator.close()

    found.tags_missing = admin_missing
    try:
        asyncio.run(ask())
    except TimeoutError:
        say_error(f"the broker was not reached within --timeout-s {timeout_s:g} s")
        return ExitCode.FAILURE
    for reply in replies:
        try:
            found.replies.append(decode_inspect_reply(reply))
        except ProtocolError as exc:
            found.unreadable.append(str(exc))
    print(render_json(found) if arguments.json else render_table(found))
    return ExitCode.OK if found.all_answered else ExitCode.FAILURE


async def _listed(listing: asyncio.Task[list[str]]) -> tuple[list[str] | None, str]:
    """The consumer tags ``rabbitmqctl`` listed by now, or ``None`` and why not."""
    if not listing.done():
        listing.cancel()
        with contextlib.suppress(BaseException):
            await listing
        return None, "rabbitmqctl did not answer within --timeout-s"
    try:
        return listing.result(), ""
    except AdminError as exc:
        return None, str(exc)


# --- purge -------------------------------------------------------------------------------------


def _purge(settings: WorkerSettings, service: str, *, yes: bool) -> int:
    queue = settings.in_queue(service)
    url = settings.broker_url.get_secret_value()

    async def count() -> int:
        operator = Operator(url, connect_timeout_s=CONNECT_S)
        try:
            await operator.connect()
            return (await operator.queue(queue)).messages
        finally:
            await operator.close()

    async def purge() -> int:
        operator = Operator(url, connect_timeout_s=CONNECT_S)
        try:
            await operator.connect()
            return await operator.purge(await operator.queue(queue))
        finally:
            await operator.close()

    if not yes:
        ready = asyncio.run(count())
        # The question on stderr, the answer from stdin (the terminal): stdout has the result.
        question = f"Purge the {ready} message(s) ready in {queue} (service {service})? [y/N] "
        print(question, end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline()
        if answer.strip().lower() not in ("y", "yes"):
            print("not purged", file=sys.stderr)
            return ExitCode.OK
    purged = asyncio.run(purge())
    print(f"purged {purged} message(s) from {queue}")
    return ExitCode.OK


# --- reports -----------------------------------------------------------------------------------


def _reports(settings: WorkerSettings, service: str, *, follow: bool) -> int:
    queue = settings.out_queue(service)
    print(
        f"reports: reading {queue} (service {service}). This CONSUMES the reports: the API will "
        f"not see the ones printed here.{' Ctrl-C stops.' if follow else ''}",
        file=sys.stderr,
        flush=True,
    )
    written = [0]
    pipe_closed = [False]

    def write(body: bytes) -> bool:
        try:
            report = decode_report(body)
        except ProtocolError as exc:
            print(
                f"reports: left a message that is not a report in {queue}: {exc}", file=sys.stderr
            )
            return False
        try:
            print(report_line(report), flush=True)
        except BrokenPipeError:
            pipe_closed[0] = True
            stopped.set()
            return False  # not acked: it goes back to the queue
        written[0] += 1
        return True

    stopped = asyncio.Event()

    async def read() -> None:
        operator = Operator(settings.broker_url.get_secret_value(), connect_timeout_s=CONNECT_S)
        try:
            await operator.connect()
            await operator.read(await operator.queue(queue), write, follow=follow, stopped=stopped)
        finally:
            await operator.close()

    try:
        asyncio.run(read())
    except KeyboardInterrupt:  # Ctrl-C: the normal end of --follow; the connection is closed
        print(f"reports: {written[0]} report(s) printed and taken from {queue}", file=sys.stderr)
        return INTERRUPTED
    print(f"reports: {written[0]} report(s) printed and taken from {queue}", file=sys.stderr)
    if pipe_closed[0]:  # ``reports | head``: stopped as every command is (``cli.main``)
        raise BrokenPipeError
    return ExitCode.OK
