"""The hand-rolled worker (``tests/conformance/raw_worker.py``), correct mode, on a real broker.

A few quick checks that the worker the conformance kit is measured against does speak the
protocol: it runs as a process on a quorum input queue of the tests' vhost, and the reports it
publishes are read back with the SDK's own report decoder. Every wait is on an event (the
``ready`` line, a report arriving), bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from async_task_api_worker.protocol import (
    FailureReport,
    ProgressReport,
    StartedReport,
    SuccessReport,
    decode_report,
    encode_report,
)
from tests.conformance.raw_worker import broker_attempt
from tests.integration.conftest import REPO, Queues, broker, broker_status, queues, quorum_vhost

# The broker fixtures of the integration tests, used here by name.
__all__ = ["broker", "broker_status", "queues", "quorum_vhost"]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

SERVICE = "conformance"
#: The longest wait for the worker's ``ready`` line, or for one task's reports.
WAIT_S = 8.0

AnyReport = StartedReport | ProgressReport | SuccessReport | FailureReport


@dataclass
class Seen:
    """One report as the output queue gave it: the message and its decoded body."""

    message: AbstractIncomingMessage
    report: AnyReport


@dataclass
class Broker:
    """The test's side of the broker: publishes bodies, collects the worker's reports."""

    channel: AbstractChannel
    queues: Queues
    reports: dict[str, list[Seen]] = field(default_factory=lambda: defaultdict(list))
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def take(self, message: AbstractIncomingMessage) -> None:
        """Keep a report (decoding it with the SDK's consumer-side decoder)."""
        report = decode_report(message.body)
        self.reports[report.task_id].append(Seen(message, report))
        self.arrived.set()

    async def publish(self, body: bytes, task_id: str) -> None:
        """Publish ``body`` to the input queue as a producer does (docs/protocol.md)."""
        message = aio_pika.Message(
            body,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=task_id,
        )
        await self.channel.default_exchange.publish(message, routing_key=self.queues.in_queue)

    async def submit(self, task_input: dict[str, Any]) -> str:
        """Publish an envelope for the worker's service; returns its task id."""
        task_id = f"t-{uuid.uuid4().hex[:12]}"
        await self.publish(envelope(task_id, task_input), task_id)
        return task_id

    async def concluded(self, task_id: str) -> list[Seen]:
        """The reports of ``task_id`` once its terminal report is in."""
        async with asyncio.timeout(WAIT_S):
            while not any(
                seen.report.type in ("success", "failure") for seen in self.reports[task_id]
            ):
                self.arrived.clear()  # no await in between: no report can slip past
                await self.arrived.wait()
        return self.reports[task_id]


def envelope(task_id: str, task_input: dict[str, Any], *, service: str = SERVICE) -> bytes:
    """An envelope's bytes."""
    document = {
        "protocol_version": 1,
        "task_id": task_id,
        "client_id": "client-a",
        "service": service,
        "input": task_input,
    }
    return json.dumps(document).encode()


@pytest.fixture
async def worker(queues: Queues, tmp_path: Path) -> AsyncIterator[Broker]:
    """The raw worker running on a quorum input queue, and a connection to watch it.

    The worker is stopped with SIGTERM afterwards, which must end it with status 0.
    """
    stderr_path = tmp_path / "raw_worker.stderr"
    with stderr_path.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.conformance.raw_worker",
            cwd=REPO,
            env=queues.env(SERVICE=SERVICE, WORKER_PROGRESS_MIN_INTERVAL_S="0.05", BREAK=""),
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
    try:
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), WAIT_S)
        except TimeoutError:
            line = b""
        assert line == b"ready\n", f"no ready line; stderr:\n{stderr_path.read_text()}"
        connection = await aio_pika.connect(queues.url)
        async with connection:
            channel = await connection.channel()
            side = Broker(channel, queues)
            out_queue = await channel.declare_queue(queues.out_queue, passive=True)
            await out_queue.consume(side.take, no_ack=True)
            yield side
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        status = await asyncio.wait_for(process.wait(), WAIT_S)
    assert status == 0, f"exit status {status}; stderr:\n{stderr_path.read_text()}"


def _check_wire(seen: list[Seen], task_id: str) -> None:
    """Every report: canonical bytes and the protocol's AMQP properties, ``seq`` from 0."""
    for seq, item in enumerate(seen):
        message, report = item.message, item.report
        assert encode_report(report, seq=seq).body == message.body
        assert message.message_id == f"{task_id}/{report.attempt}/{seq}"
        assert message.correlation_id == task_id
        assert message.type == report.type
        assert message.app_id == SERVICE
        assert message.content_type == "application/json"
        assert message.content_encoding == "utf-8"
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert message.timestamp is not None
        assert report.timestamp.startswith(message.timestamp.strftime("%Y-%m-%dT%H:%M:%S"))


async def test_succeed_reports_started_then_success(worker: Broker) -> None:
    output = {"b": [1, 2.5], "a": "é 漢字", "n": None}
    task_id = await worker.submit({"behaviour": "succeed", "output": output, "padding": "xx"})

    seen = await worker.concluded(task_id)

    assert [item.report.type for item in seen] == ["started", "success"]
    success = seen[-1].report
    assert isinstance(success, SuccessReport)
    assert success.response == output
    assert (success.attempt, success.client_id, success.service) == (1, "client-a", SERVICE)
    _check_wire(seen, task_id)


async def test_progress_is_ordered_before_the_success(worker: Broker) -> None:
    fractions = [0.2, 0.4, 0.6]
    task_id = await worker.submit(
        {"behaviour": "progress", "fractions": fractions, "payload": {"k": 1}, "interval_s": 0.1}
    )

    seen = await worker.concluded(task_id)

    kinds = [item.report.type for item in seen]
    assert kinds[0] == "started"
    assert kinds[-1] == "success"
    progress = [item.report for item in seen[1:-1]]
    assert progress
    assert all(isinstance(report, ProgressReport) for report in progress)
    published = [report.fraction for report in progress if isinstance(report, ProgressReport)]
    assert published == sorted(published)
    assert set(published) <= set(fractions)
    assert published[-1] == fractions[-1]  # a held update is flushed before the terminal report
    assert all(
        report.payload == {"k": 1} for report in progress if isinstance(report, ProgressReport)
    )
    _check_wire(seen, task_id)


async def test_a_poison_body_with_a_task_id_gets_one_failure(worker: Broker) -> None:
    task_id = f"p-{uuid.uuid4().hex[:12]}"
    # No input, and a client id off the id pattern: invalid, the task id still recovered.
    body = json.dumps(
        {"protocol_version": 1, "task_id": task_id, "client_id": "no spaces", "service": SERVICE}
    ).encode()
    await worker.publish(body, task_id)

    seen = await worker.concluded(task_id)

    assert [item.report.type for item in seen] == ["failure"]
    failure = seen[0].report
    assert isinstance(failure, FailureReport)
    assert failure.error.code == "POISON_MESSAGE"
    assert failure.error.message.startswith("the message was refused: invalid_envelope: ")
    assert (failure.client_id, failure.service, failure.attempt) == (None, SERVICE, 1)
    _check_wire(seen, task_id)


async def test_wrong_service_is_poison_too(worker: Broker) -> None:
    task_id = f"p-{uuid.uuid4().hex[:12]}"
    await worker.publish(envelope(task_id, {"behaviour": "succeed"}, service="other"), task_id)

    seen = await worker.concluded(task_id)

    failure = seen[0].report
    assert isinstance(failure, FailureReport)
    assert [item.report.type for item in seen] == ["failure"]
    assert failure.error.code == "POISON_MESSAGE"
    assert failure.error.message.startswith("the message was refused: wrong_service: ")
    assert failure.client_id == "client-a"


async def test_a_retry_comes_back_as_the_next_attempt(worker: Broker) -> None:
    task_id = await worker.submit({"behaviour": "retry", "until_attempt": 2, "retry_delay_s": 0})

    seen = await worker.concluded(task_id)

    assert [(item.report.type, item.report.attempt) for item in seen] == [
        ("started", 1),
        ("started", 2),
        ("success", 2),
    ]


async def test_an_unknown_behaviour_is_invalid_input(worker: Broker) -> None:
    task_id = await worker.submit({"behaviour": "dance"})

    seen = await worker.concluded(task_id)

    failure = seen[0].report
    assert isinstance(failure, FailureReport)
    assert [item.report.type for item in seen] == ["failure"]
    assert failure.error.code == "INVALID_INPUT"


@pytest.mark.parametrize(
    ("redelivered", "headers", "quorum", "number"),
    [
        (False, {"x-delivery-count": 7}, True, 1),  # a producer's forged count
        (True, {"x-delivery-count": 2}, True, 3),
        (True, {"x-acquired-count": 1}, True, 1),  # 4.3 after a give-back or consumer timeout
        (True, {}, False, 2),  # a classic queue only tells first from not first
    ],
)
def test_the_broker_attempt_of_a_delivery(
    redelivered: bool, headers: dict[str, Any], quorum: bool, number: int
) -> None:
    message = cast(
        "AbstractIncomingMessage", SimpleNamespace(redelivered=redelivered, headers=headers)
    )

    assert broker_attempt(message, quorum=quorum, delivery_limit=5).number == number
