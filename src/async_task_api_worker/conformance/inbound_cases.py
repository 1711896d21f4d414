"""The cases about what a worker takes in: a round trip, poison bodies, the limits.

See ``conformance.case`` for what a case is; docs/protocol.md for the rules.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from async_task_api_worker.conformance.case import (
    CATCH_WINDOW_S,
    Findings,
    Setup,
    attempt_of,
    envelope,
    error_code,
    kinds,
    one_success,
    task_id,
)
from async_task_api_worker.conformance.dead_letters import DeadLetters, dead_letter_target
from async_task_api_worker.conformance.differences import MISSING, value_difference
from async_task_api_worker.conformance.wire import Wire
from async_task_api_worker.protocol.codes import ErrorCode
from async_task_api_worker.protocol.encoding import MAX_NESTING_DEPTH

__all__ = ["decoding", "limits", "nested", "padded", "round_trip"]

# ------------------------------------------------------------------------------- round trip


async def round_trip(wire: Wire, setup: Setup, found: Findings) -> None:
    """``succeed``: ``started`` then ``success`` with the output as the response, attempt 1."""
    tid = task_id(setup, "round_trip", 1)
    output = {"hello": "world"}
    body = envelope(setup, tid, {"behaviour": "succeed", "output": output})
    await wire.publish(body, message_id=tid)
    reports = await wire.wait_terminal(tid)
    if not found.expect(bool(reports), f"no report for {tid} within {wire.timeout_s:.0f} s"):
        return
    found.expect(reports[0].type == "started", f"first report is {reports[0].type}, not started")
    success = one_success(found, tid, reports, tid)
    if success is not None and success.document is not None:
        wrong = value_difference(output, success.document.get("response", MISSING), "response")
        found.expect(wrong is None, f"the response is not the output: {wrong}")
        found.expect(attempt_of(success) == 1, "a first delivery is not attempt 1")
    found.notes.append(f"{tid}: {kinds(reports)}")


# ------------------------------------------------------------------------------- decoding


async def decoding(wire: Wire, setup: Setup, found: Findings) -> None:
    """Poison bodies: one ``failure POISON_MESSAGE`` when the id is readable, else a reject.

    docs/protocol.md, "Decoding and poison messages": with a readable task id, one failure
    (no ``started``), acked; without one, no report and a reject (never requeued, never acked),
    seen at a dead-letter target of the kit's own (``conformance.dead_letters``; not checked
    without ``rabbitmqctl``). A bad input is ``INVALID_INPUT``. The worker serves the next task.
    The failures' ``client_id`` (the one recovered) and ``service`` are checked with every
    report's (``conformance.report_rules``).
    """
    with_id, without_id = _poison_bodies(setup)
    invalid_input = task_id(setup, "decoding", len(with_id) + len(without_id) + 1)
    sentinel = task_id(setup, "decoding", len(with_id) + len(without_id) + 2)
    async with contextlib.AsyncExitStack() as stack:
        letters = await _dead_letter_target(stack, wire, setup, found)
        for tid, body, _ in with_id:
            await wire.publish(body, message_id=tid)
        for _, body, _ in without_id:
            await wire.publish(body)
        await wire.publish(envelope(setup, invalid_input, {"behaviour": "dance"}))
        await wire.publish(envelope(setup, sentinel, {"behaviour": "succeed"}))

        for tid, _, what in with_id:
            reports = await wire.wait_terminal(tid)
            found.expect(
                len(reports) == 1 and error_code(reports[0]) == ErrorCode.POISON_MESSAGE,
                f"{what}: expected one failure POISON_MESSAGE, saw {kinds(reports)}",
            )
        reports = await wire.wait_terminal(invalid_input)
        found.expect(
            [seen.type for seen in reports] == ["failure"]
            and error_code(reports[0]) == ErrorCode.INVALID_INPUT,
            f"an unknown behaviour: expected one failure INVALID_INPUT, saw {kinds(reports)}",
        )
        reports = await wire.wait_terminal(sentinel)
        one_success(found, sentinel, reports, "the task after the poison bodies")
        caught = await wire.catch_requeued(CATCH_WINDOW_S)
        found.expect(not caught, f"{len(caught)} poison bodies still or again in the input queue")
        for tid, _, what in without_id:
            reports = wire.reports(tid)
            found.expect(not reports, f"{what}: {len(reports)} reports for an unreadable task id")
        if letters is not None:
            settled = [entry for entry in without_id if entry[1] not in caught]
            # Rejected before the sentinel's success, as a rule; a worker that acked them makes
            # the kit wait this long.
            await letters.wait_for([body for _, body, _ in settled], CATCH_WINDOW_S)
            _rejected(found, letters, with_id, settled)
    found.notes.append(
        f"{len(with_id)} bodies with a task id, {len(without_id)} without"
        + (" (their rejects checked)" if letters is not None else "")
        + ", one bad input"
    )


Bodies = list[tuple[str, bytes, str]]  # task id, body, what it is


def _poison_bodies(setup: Setup) -> tuple[Bodies, Bodies]:
    """The ``decoding`` case's poison bodies: those whose task id is readable, those without."""
    tids = [task_id(setup, "decoding", n) for n in range(1, 9)]
    with_id = [
        (tids[0], envelope(setup, tids[0], {}, protocol_version=2), "version 2"),
        (tids[1], envelope(setup, tids[1], "text"), "input not an object"),
        (tids[2], envelope(setup, tids[2], {}, service=f"not-{setup.service}"), "another service"),
        (tids[3], envelope(setup, tids[3], {}, client_id=None), "client_id null"),
    ]
    bad = f"bad id {tids[7]}"
    without_id = [
        (tids[4], b'\xff\xfe{"task_id":"' + tids[4].encode() + b'"}', "not UTF-8"),
        (tids[5], b'{"task_id":"' + tids[5].encode() + b'","input":{', "truncated JSON"),
        (tids[6], json.dumps([tids[6]]).encode(), "an array"),
        (bad, envelope(setup, bad, {"behaviour": "succeed"}), "task id with spaces"),
    ]
    return with_id, without_id


async def _dead_letter_target(
    stack: contextlib.AsyncExitStack, wire: Wire, setup: Setup, found: Findings
) -> DeadLetters | None:
    """The kit's dead-letter target for the rest of ``stack``; ``None`` (and a note) if none."""
    if setup.admin is None:
        found.unchecked.append(f"rejects: {setup.admin_missing}")
        return None
    letters = await stack.enter_async_context(dead_letter_target(wire, setup.admin))
    if letters.missing:
        found.unchecked.append(f"rejects: {letters.missing}")
        return None
    if letters.own:
        found.notes.append(f"rejects seen at {wire.in_queue!r}'s own exchange {letters.own!r}")
    return letters


def _rejected(
    found: Findings,
    letters: DeadLetters,
    with_id: Bodies,
    without_id: Bodies,
) -> None:
    """Each body without a task id dead-lettered as rejected; none with one (those are acked).

    ``without_id`` leaves out the bodies caught in the input queue (requeued: said already).
    """
    for _, body, what in without_id:
        reason = letters.arrived.get(body)
        if found.expect(
            body in letters.arrived, f"{what}: acked, not rejected (never dead-lettered)"
        ):
            found.expect(reason == "rejected", f"{what}: dead-lettered for {reason}, not rejected")
    for _, body, what in with_id:
        found.expect(
            body not in letters.arrived,
            f"{what}: rejected, but a body whose task id was read is acked after its failure",
        )


# ------------------------------------------------------------------------------- limits


def nested(levels: int) -> Any:
    """Lists nested ``levels`` deep (``[[...[]...]]``): an input at the nesting limit's edge."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def padded(setup: Setup, tid: str, size: int) -> bytes:
    """An envelope of exactly ``size`` bytes: a ``succeed`` input padded with ``x``."""
    empty = envelope(setup, tid, {"behaviour": "succeed", "padding": ""})
    return envelope(setup, tid, {"behaviour": "succeed", "padding": "x" * (size - len(empty))})


async def limits(wire: Wire, setup: Setup, found: Findings) -> None:
    """The documented limits, each at its edge: id syntax, nesting depth, message size.

    docs/protocol.md, "The envelope" and "Decoding and poison messages": a task id of 128
    characters is taken, of 129 is unreadable (no report); a body nesting 64 levels is taken,
    65 is ``too_deep`` (a ``POISON_MESSAGE`` failure); a body of ``WORKER_MAX_MESSAGE_BYTES`` is
    taken, one byte more is ``too_large`` (no report). How the refused bodies are settled is
    the ``decoding`` case's to judge.
    """
    prefix = task_id(setup, "limits", 0)
    longest = (prefix + "-" + "x" * 128)[:128]
    too_long = longest + "y"
    # The envelope is level 1 and its input level 2: a list nested n levels inside the input
    # reaches level n + 2.
    deep_ok = task_id(setup, "limits", 1)
    too_deep = task_id(setup, "limits", 2)
    at_size = task_id(setup, "limits", 3)
    over_size = task_id(setup, "limits", 4)
    inside = MAX_NESTING_DEPTH - 2
    await wire.publish(envelope(setup, longest, {"behaviour": "succeed"}), message_id=longest)
    await wire.publish(envelope(setup, too_long, {"behaviour": "succeed"}))
    await wire.publish(
        envelope(setup, deep_ok, {"behaviour": "succeed", "deep": nested(inside)}),
        message_id=deep_ok,
    )
    await wire.publish(
        envelope(setup, too_deep, {"behaviour": "succeed", "deep": nested(inside + 1)}),
        message_id=too_deep,
    )
    # Each body judged on its own: a broker whose max_message_size is the worker's limit takes
    # the body at the limit and refuses the one over it.
    size = setup.max_message_bytes
    at_refused = await wire.try_publish(padded(setup, at_size, size), message_id=at_size)
    over_refused = await wire.try_publish(padded(setup, over_size, size + 1))
    for bytes_, refused in ((size, at_refused), (size + 1, over_refused)):
        if refused is not None:
            found.notes.append(
                f"the broker refused the body of {bytes_} bytes ({refused}): its "
                f"max_message_size is lower; that body not checked"
            )

    reports = await wire.wait_terminal(longest)
    one_success(found, longest, reports, "a task id of 128 characters")
    reports = await wire.wait_terminal(deep_ok)
    one_success(found, deep_ok, reports, f"a body nesting {MAX_NESTING_DEPTH} levels")
    # Only the first report is this case's: settling a poison body once is "decoding"'s rule.
    reports = (await wire.wait_terminal(too_deep))[:1]
    found.expect(
        [seen.type for seen in reports] == ["failure"]
        and error_code(reports[0]) == ErrorCode.POISON_MESSAGE,
        f"a body nesting {MAX_NESTING_DEPTH + 1} levels: expected a failure POISON_MESSAGE, "
        f"saw {kinds(reports)}",
    )
    if at_refused is None:
        reports = await wire.wait_terminal(at_size)
        one_success(found, at_size, reports, f"a body of {size} bytes")
    # Taken away, not judged: whether a refused body is requeued is "decoding"'s rule; here it
    # must only not linger into the next case.
    await wire.catch_requeued(CATCH_WINDOW_S)
    found.notes.append(
        f"ids of 128 and 129 characters, depth {MAX_NESTING_DEPTH} and {MAX_NESTING_DEPTH + 1}"
        + "".join(
            f", a body of {bytes_} bytes"
            for bytes_, refused in ((size, at_refused), (size + 1, over_refused))
            if refused is None
        )
    )
    found.expect(not wire.reports(too_long), "reports for a task id of 129 characters")
    if over_refused is None:
        found.expect(
            not wire.reports(over_size),
            f"reports for a body of {size + 1} bytes (too large: its task id must not be read)",
        )
