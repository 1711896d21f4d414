"""The cases about settling a delivery: attempts and the delivery limit, the ack's moment.

See ``conformance.case`` for what a case is; docs/protocol.md for the rules.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from async_task_api_worker.conformance.admin import (
    Admin,
    AdminError,
    hold_length,
    release_at_end,
)
from async_task_api_worker.conformance.case import (
    CATCH_WINDOW_S,
    HOLD_S,
    SLEEP_S,
    Findings,
    Setup,
    Skip,
    attempt_of,
    capped,
    envelope,
    error_code,
    kinds,
    one_success,
    per_attempt,
    task_id,
    terminal,
)
from async_task_api_worker.conformance.differences import MISSING, shown
from async_task_api_worker.conformance.wire import Seen, Wire
from async_task_api_worker.protocol.codes import ErrorCode
from async_task_api_worker.transports.rabbitmq.topology import queue_type

__all__ = ["acknowledgement", "deliveries", "never_grew", "retries", "settled", "until"]

# ------------------------------------------------------------------------------- retries


async def retries(wire: Wire, setup: Setup, found: Findings) -> None:
    """Attempts from the broker's delivery count; the last attempt concludes; past it, abandon.

    docs/protocol.md, "Attempts and the delivery limit". The kit takes each task before the
    worker and gives it back (``Wire.borrow``), so that the worker first sees it with a count
    it never caused: a worker that counts attempts itself reports the wrong one. At the end,
    what is left of the case's tasks in the input queue is taken out (a worker whose attempt
    never reaches the limit requeues its retried task for ever), so that the later cases see
    the worker as it is.
    """
    if wire.in_queue_type != "quorum":
        raise Skip(
            f"the input queue is {wire.in_queue_type}: only a quorum queue counts deliveries"
        )
    try:
        await _attempts(wire, setup, found)
    finally:
        caught = await wire.catch_requeued(CATCH_WINDOW_S)
        if caught:
            found.notes.append(
                f"taken out of the input queue at the case's end: {len(caught):,} "
                f"{'delivery' if len(caught) == 1 else 'deliveries'} of its tasks"
            )


async def _attempts(wire: Wire, setup: Setup, found: Findings) -> None:
    limit = setup.delivery_limit
    counted = task_id(setup, "retries", 1)
    counts = await wire.borrow(envelope(setup, counted, {"behaviour": "succeed"}), counted, times=2)
    if counts[1:] and counts[1] is None:
        raise Skip("the broker does not count a delivery given back (no x-delivery-count)")
    reports = await wire.wait_terminal(counted)
    found.expect(
        per_attempt(reports) == [(3, "started"), (3, "success")],
        f"given back twice before the worker: expected started and success at attempt 3, "
        f"saw {_saw(reports)}",
    )

    # A producer must not set x-delivery-count, and a first delivery is attempt 1 whatever it
    # says (RabbitMQ 3.10 passes a producer's own header through on a first delivery).
    forged = task_id(setup, "retries", 4)
    body = envelope(setup, forged, {"behaviour": "succeed"})
    await wire.publish(body, message_id=forged, headers={"x-delivery-count": limit + 2})
    reports = await wire.wait_terminal(forged)
    found.expect(
        per_attempt(reports) == [(1, "started"), (1, "success")],
        f"a first delivery carrying a forged x-delivery-count of {limit + 2}: expected started "
        f"and success at attempt 1, saw {_saw(reports)}",
    )

    abandoned = task_id(setup, "retries", 2)
    await wire.borrow(envelope(setup, abandoned, {"behaviour": "succeed"}), abandoned, limit)
    reports = await wire.wait_terminal(abandoned)
    attempts = [attempt_of(seen) for seen in reports]
    found.expect(
        [seen.type for seen in reports] == ["failure"]
        and error_code(reports[0]) == ErrorCode.TASK_ABANDONED_AFTER_REDELIVERIES
        and attempts == [limit + 1],
        f"given back {limit} times (the limit): expected one failure "
        f"TASK_ABANDONED_AFTER_REDELIVERIES at attempt {limit + 1} without running, saw "
        f"{_saw(reports)}",
    )

    last = task_id(setup, "retries", 3)
    before = max(limit - 2, 0)
    retry = {"behaviour": "retry", "code": "CONFORMANCE_RETRY", "retry_delay_s": 0}
    await wire.borrow(envelope(setup, last, retry), last, before)
    expected = [(attempt, "started") for attempt in range(before + 1, limit + 1)]
    # A worker whose attempt never reaches the limit retries for ever: waited for until the
    # task was delivered more often than any count within the limit allows, not for the
    # whole timeout (one that counts attempts itself, from 1, still ends within it).
    reports = await wire.wait_for(
        last, lambda seen: terminal(seen) is not None or deliveries(seen) > limit + 1
    )
    if terminal(reports) is not None:
        reports = await wire.wait_terminal(last)
    expected.append((limit, "failure"))
    seen_pairs = [(attempt_of(s), s.type) for s in reports if s.type != "progress"]
    found.expect(
        per_attempt(reports) == expected and error_code(terminal(reports)) == "CONFORMANCE_RETRY",
        f"a retryable error from attempt {before + 1}: expected {expected} ending in "
        f"CONFORMANCE_RETRY, saw [{capped(seen_pairs)}]{never_grew(reports)}",
    )
    found.notes.append(f"delivery limit {limit}; the broker's counts when borrowed: {counts}")


def _saw(reports: list[Seen]) -> str:
    """The reports' types and attempts, for a line: ``started,success at attempts [3, 3]``."""
    attempts = [attempt_of(seen) for seen in reports]
    return f"{kinds(reports)} at attempts [{capped(attempts)}]"


def _opens_delivery(seen: Seen) -> bool:
    """Whether ``seen`` is the first report of a delivery (its ``seq`` is 0)."""
    return str(seen.properties.get("message_id")).endswith("/0")


def deliveries(reports: list[Seen]) -> int:
    """How many deliveries ``reports`` (one task's) come from: each one's first has ``seq`` 0."""
    return sum(_opens_delivery(seen) for seen in reports)


def never_grew(reports: list[Seen]) -> str:
    """A hint for a line when a task's deliveries all reported one attempt; else ``""``.

    Returns:
        ``; the attempt never grew (N deliveries, each attempt A): read x-delivery-count`` when
        more than one delivery (``deliveries``) said the same attempt.
    """
    firsts = [
        shown((seen.document or {}).get("attempt", MISSING))
        for seen in reports
        if _opens_delivery(seen)
    ]
    if len(firsts) < 2 or len(set(firsts)) > 1:
        return ""
    return (
        f"; the attempt never grew ({len(firsts):,} deliveries, each attempt {firsts[0]}): "
        f"read x-delivery-count"
    )


# ------------------------------------------------------------------------------- acknowledgement


async def acknowledgement(wire: Wire, setup: Setup, found: Findings) -> None:
    """The input stays unacked while its terminal report is refused, and is acked after it.

    docs/protocol.md, "Ordering and duplicates": the ack follows the terminal report's
    confirm, not the receipt, nor ``started``'s confirm, nor the handler's return. Before the
    task is sent, the kit stops reading the output queue, waits until it is empty, and holds it
    to one message (``Admin.hold``, sized by the queue's type: ``hold_length``), so that
    ``started`` is taken and the terminal report refused, however late the worker sends them.
    It learns that ``started`` arrived from the queue's message count, without taking it. Once
    the handler must have returned, plus ``HOLD_S``, the vhost's unacked deliveries
    (``Admin.unacked``) show whether the input was acked.
    """
    admin = setup.admin
    if admin is None:
        raise Skip(f"needs a policy on the output queue: {setup.admin_missing}")
    kind = await queue_type(wire.connection, wire.out_queue)
    limit = hold_length(kind)
    if limit is None:
        raise Skip(f"the output queue is a {kind} queue: the kit can hold a quorum or classic one")
    tid = task_id(setup, "acknowledgement", 1)
    asked = False  # for the hold policy
    try:
        if not await until(lambda: _quiet(wire), wire.timeout_s):
            raise Skip(f"the output queue did not empty within {wire.timeout_s:.0f} s")
        asked = True
        await admin.hold(wire.out_queue, limit)
        if not await until(lambda: admin.holding(wire.out_queue), wire.timeout_s):
            raise Skip(f"the hold policy was not in force within {wire.timeout_s:.0f} s")
        body = envelope(setup, tid, {"behaviour": "sleep", "seconds": SLEEP_S})
        await wire.publish(body, message_id=tid)
        if not found.expect(
            await until(lambda: _holds_some(wire), wire.timeout_s),
            f"no report reached the output queue within {wire.timeout_s:.0f} s",
        ):
            return
        # The handler runs once started is sent: it has returned SLEEP_S after that arrived.
        await asyncio.sleep(SLEEP_S + HOLD_S)
        held = await wire.ready(wire.out_queue)
        if held != 1:
            raise Skip(
                f"the {kind} output queue, held to one message (max-length {limit}), took "
                f"{held}: the broker did not hold it, the case cannot judge"
            )
        ready, unacked = await wire.ready(), await admin.unacked()
        held_unacked = unacked >= 1 and ready == 0
        said = f"the input was {'acked' if unacked == 0 and ready == 0 else 'given back'}"
        gone = await wire.worker_gone() if not held_unacked and ready else None
        # A worker that stopped in the hold gave the input back: say why instead.
        found.expect(
            held_unacked,
            f"{HOLD_S:.0f} s after the handler returned, its terminal report refused, "
            f"{gone or said} (ready {ready}, unacked {unacked})",
        )
        if gone:
            return  # no report will come: the later waits would only time out
    except AdminError as exc:
        raise Skip(f"the operator tool failed: {exc}") from exc
    finally:
        await release_at_end(admin, was_set=asked)
        await wire.resume_reports()
    reports = await wire.wait_terminal(tid)
    one_success(found, tid, reports, "once the output queue took reports again")
    acked = await until(lambda: settled(wire, admin), wire.timeout_s)
    found.expect(acked, "the input was not acked after its terminal report")
    found.notes.append(
        f"{kind} output queue held to one report (max-length {limit}) before the task, "
        f"{HOLD_S:.0f} s past the handler's return: {kinds(reports)}"
    )


async def _quiet(wire: Wire) -> bool:
    """Stop reading the output queue; whether it is empty (else read on, to empty it)."""
    await wire.pause_reports()
    if await wire.ready(wire.out_queue) == 0:
        return True
    await wire.resume_reports()
    return False


async def _holds_some(wire: Wire) -> bool:
    return await wire.ready(wire.out_queue) >= 1


async def settled(wire: Wire, admin: Admin) -> bool:
    """Whether the input queue has nothing ready and the vhost nothing unacked."""
    return await wire.ready() == 0 and await admin.unacked() == 0


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
    """Whether ``check()`` came to hold within ``timeout_s`` (asked every 0.1 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if await check():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.1)
