"""The opt-in ``cancel`` case: a cancel before delivery, during a run, and after the end.

docs/protocol.md, "Cancelling a task". Cancels are optional in protocol version 1, so the case
runs only when asked for (``--with cancel``), for a worker that claims them. The kit publishes
its cancel requests as this SDK's client does (``TaskClient.cancel``: the canonical request of
``protocol.cancel.encode_cancel``, publisher confirms, ``mandatory``), to the worker's control
exchange (``CONTROL_EXCHANGE_NAME``); a request that comes back reached no worker, and fails
the case. See ``conformance.case`` for what a case is.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from async_task_api_worker.client import TaskClient
from async_task_api_worker.conformance.case import (
    CLIENT_ID,
    SETTLE_S,
    Findings,
    Setup,
    Skip,
    envelope,
    error_code,
    one_success,
    task_id,
)
from async_task_api_worker.conformance.settle_cases import settled, until
from async_task_api_worker.conformance.wire import Seen, Wire
from async_task_api_worker.protocol.codes import ErrorCode
from async_task_api_worker.settings import WorkerSettings

__all__ = ["CANCELLED_SLEEP_S", "cancel"]

#: How long the task cancelled during its run would sleep, in seconds: far longer than a cancel
#: takes to arrive, so that a success means the cancel was ignored. The kit watches the task
#: until its sleep would have ended (plus ``SETTLE_S``), so that a worker that reports the
#: cancel but runs on is seen when it reports again.
CANCELLED_SLEEP_S: Final = 5.0


async def cancel(wire: Wire, setup: Setup, found: Findings) -> None:
    """A cancel before delivery, during a run and after the end, each as the protocol says.

    - **Before delivery**: the cancel is published and confirmed before the task is (so that no
      load can let the task reach the worker first): one ``failure`` ``TASK_CANCELLED``, no
      ``started``.
    - **During a run**: a ``sleep`` task, cancelled once its ``started`` arrived: ``started``,
      then one ``failure`` ``TASK_CANCELLED``, nothing after (watched until the sleep would
      have ended, plus ``SETTLE_S``); the input acked.
    - **After the end**: a ``succeed`` task, cancelled once its ``success`` arrived: nothing
      more within ``SETTLE_S``, and the worker still answers the next task.
    """
    if not setup.broker_url:
        raise Skip("the kit was given no broker URL to publish its cancel requests with")
    # The exchange's default name is the settings' rule, as the client's own default is.
    exchange = setup.control_exchange or WorkerSettings.model_construct().control_exchange(
        setup.service
    )
    client = TaskClient(
        url=setup.broker_url,
        service=setup.service,
        in_queue=wire.in_queue,
        out_queue=wire.out_queue,
        control_exchange=exchange,
        client_id=CLIENT_ID,
    )
    await client.connect(reports=False)  # it publishes cancels only: the kit reads the reports
    try:
        for check in (_before_delivery, _during_a_run, _after_the_end):
            if not await check(wire, setup, found, client):
                return
    finally:
        await client.close()
    admin = setup.admin
    if admin is None:
        found.expect(await until(lambda: _none_ready(wire), wire.timeout_s), _NOT_SETTLED)
        found.notes.append(f"unacked deliveries not read: {setup.admin_missing}")
    else:
        found.expect(await until(lambda: settled(wire, admin), wire.timeout_s), _NOT_SETTLED)
    found.notes.append(f"cancels published to {exchange!r}, each routed to a worker")


_NOT_SETTLED: Final = "the inputs were not all acked once their tasks concluded"


async def _none_ready(wire: Wire) -> bool:
    return await wire.ready() == 0


async def _cancel(found: Findings, client: TaskClient, tid: str) -> bool:
    """Publish a cancel of ``tid``; whether the broker routed it to a worker's queue."""
    return found.expect(
        await client.cancel(tid),
        f"the cancel of {tid} came back: no queue is bound to the exchange "
        f"{client.control_exchange!r} (does the worker take cancels, with this "
        f"CONTROL_EXCHANGE_NAME?)",
    )


def _cancelled(reports: list[Seen]) -> bool:
    return len(reports) == 1 and error_code(reports[0]) == ErrorCode.TASK_CANCELLED


def _saw(reports: list[Seen]) -> str:
    """The reports' types, a failure's code beside it: ``started,failure TASK_CANCELLED``."""
    return (
        ",".join(
            f"failure {error_code(seen)}" if seen.type == "failure" else str(seen.type)
            for seen in reports
        )
        or "nothing"
    )


async def _before_delivery(wire: Wire, setup: Setup, found: Findings, client: TaskClient) -> bool:
    tid = task_id(setup, "cancel", 1)
    if not await _cancel(found, client, tid):
        return False
    await wire.publish(envelope(setup, tid, {"behaviour": "succeed"}), message_id=tid)
    reports = await wire.wait_terminal(tid)
    found.expect(
        _cancelled(reports),
        f"a cancel before delivery: expected one failure TASK_CANCELLED without started, saw "
        f"{_saw(reports)}",
    )
    found.notes.append(f"before delivery: {_saw(reports)}")
    return True


async def _during_a_run(wire: Wire, setup: Setup, found: Findings, client: TaskClient) -> bool:
    tid = task_id(setup, "cancel", 2)
    body = envelope(setup, tid, {"behaviour": "sleep", "seconds": CANCELLED_SLEEP_S})
    await wire.publish(body, message_id=tid)
    reports = await wire.wait_for(tid, lambda seen: any(s.type == "started" for s in seen))
    if not found.expect(
        bool(reports), f"a sleep task: no started report within {wire.timeout_s:.0f} s"
    ):
        return False
    # The sleep began at most when started arrived: it ends before this moment.
    started = next(seen for seen in reports if seen.type == "started")
    sleep_ends = started.at + CANCELLED_SLEEP_S + SETTLE_S
    if not await _cancel(found, client, tid):
        return False
    # A worker that ignores the cancel ends the task when its sleep does.
    await wire.wait_for(
        tid, lambda seen: any(s.terminal for s in seen), wire.timeout_s + CANCELLED_SLEEP_S
    )
    await wire.wait_terminal(tid)
    # A worker that reported the cancel but ran on reports again when its sleep ends.
    await asyncio.sleep(max(0.0, sleep_ends - time.monotonic()))
    reports = wire.reports(tid)
    found.expect(
        [seen.type for seen in reports[:1]] == ["started"] and _cancelled(reports[1:]),
        f"a cancel during a run: expected started, then one failure TASK_CANCELLED and "
        f"nothing after, saw {_saw(reports)}",
    )
    found.notes.append(f"during a run: {_saw(reports)}")
    return True


async def _after_the_end(wire: Wire, setup: Setup, found: Findings, client: TaskClient) -> bool:
    tid = task_id(setup, "cancel", 3)
    await wire.publish(envelope(setup, tid, {"behaviour": "succeed"}), message_id=tid)
    reports = await wire.wait_terminal(tid)
    if one_success(found, tid, reports, "a task to cancel after its end") is None:
        return False
    if not await _cancel(found, client, tid):
        return False
    await asyncio.sleep(SETTLE_S)  # what follows the cancel: nothing, for a concluded task
    later = wire.reports(tid)[len(reports) :]
    found.expect(not later, f"a cancel after the end: expected nothing more, saw {_saw(later)}")
    after = task_id(setup, "cancel", 4)
    await wire.publish(envelope(setup, after, {"behaviour": "succeed"}), message_id=after)
    reports = await wire.wait_terminal(after)
    found.expect(
        [seen.type for seen in reports] == ["started", "success"],
        f"the next task after a cancel of a concluded one: expected started and success, saw "
        f"{_saw(reports)}",
    )
    found.notes.append(f"after the end: nothing more, then the next task {_saw(reports)}")
    return True
