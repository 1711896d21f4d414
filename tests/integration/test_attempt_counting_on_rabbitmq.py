"""What each RabbitMQ version counts, measured with the real worker on the pass's broker.

A task's first call does something that sends its delivery back (a ``RetryableError``, a
give-back at shutdown, a report held until it is given back, a consumer timeout, a crash, a lost
connection); the worker reaches the broker through a TCP proxy of the tests' own that reads the
frames the broker sends it, so each case sees what the redelivery carried (``redelivered``,
``x-delivery-count``, ``x-acquired-count``) and the attempt the worker reported for it (the
``started`` report). :data:`EXPECTED` holds both per version (docs/brokers.md, "Attempt counting
per version", is this table). The consumer-timeout case needs a node of its own (the broker's
``consumer_timeout`` is node-wide before 4.3): it starts one of the pass's version.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands, frame, header

from async_task_api_worker.client import TaskClient
from scripts.rabbitmq_nodes import Node, NodeSpec, default_root, root_ready
from tests.integration.conftest import Queues, rabbitmqctl
from tests.integration.tcp_proxy import TcpProxy
from tests.polling import wait_for
from tests.ports import free_port, node_name, node_port

TARGET = "tests.integration.counting_workers:counting"
SERVICE = "counting"


@dataclass(frozen=True)
class Cell:
    """What the redelivery carried, and the attempt the worker reported for it."""

    redelivered: bool
    delivery_count: int | None  # x-delivery-count; None: absent
    acquired_count: int | None  # x-acquired-count; None: absent
    attempt: int


def version_key(version: tuple[int, ...]) -> str:
    """The column of :data:`EXPECTED` for a broker version."""
    return "3.10" if version < (4, 0) else "4.0" if version < (4, 3) else "4.3"


#: Per case, per version: measured on 3.10.8, 4.0.5 and 4.3.6 (docs/brokers.md). A 4.3 redelivery
#: after a give-back or a consumer timeout carries no x-delivery-count: attempt 1 again.
EXPECTED: dict[str, dict[str, Cell]] = {
    "retryable_error": {
        "3.10": Cell(True, 1, None, 2),
        "4.0": Cell(True, 1, None, 2),
        "4.3": Cell(True, 1, 1, 2),
    },
    "give_back_at_shutdown": {
        "3.10": Cell(True, 1, None, 2),
        "4.0": Cell(True, 1, None, 2),
        "4.3": Cell(True, None, 1, 1),
    },
    "held_report_given_back": {  # NOT measured yet (the test is skipped): as a give-back
        "3.10": Cell(True, 1, None, 2),
        "4.0": Cell(True, 1, None, 2),
        "4.3": Cell(True, None, 1, 1),
    },
    "consumer_timeout": {  # 4.3: with aio-pika's tag reuse (530), then a reconnect
        "3.10": Cell(True, 1, None, 2),
        "4.0": Cell(True, 1, None, 2),
        "4.3": Cell(True, None, 1, 1),
    },
    "crash": {
        "3.10": Cell(True, 1, None, 2),
        "4.0": Cell(True, 1, None, 2),
        "4.3": Cell(True, 1, 1, 2),
    },
    "connection_loss": {
        "3.10": Cell(True, 1, None, 2),
        "4.0": Cell(True, 1, None, 2),
        "4.3": Cell(True, 1, 1, 2),
    },
}


class DeliveryTap:
    """Reads the AMQP frames a broker sends through a :class:`TcpProxy`: every delivery's
    ``redelivered`` and headers, per queue, in order."""

    def __init__(self) -> None:
        self._buffers: dict[int, bytes] = {}
        self._pending: dict[tuple[int, int], commands.Basic.Deliver] = {}
        self._lock = threading.Lock()
        self.deliveries: list[tuple[str, bool, dict[str, Any]]] = []

    def __call__(self, connection: int, data: bytes) -> None:
        buffer = self._buffers.get(connection, b"") + data
        while len(buffer) >= 7:
            size = int.from_bytes(buffer[3:7], "big")
            if len(buffer) < size + 8:
                break
            _, channel, read = frame.unmarshal(buffer[: size + 8])
            buffer = buffer[size + 8 :]
            if isinstance(read, commands.Basic.Deliver):
                self._pending[(connection, channel)] = read
            elif isinstance(read, header.ContentHeader):
                deliver = self._pending.pop((connection, channel), None)
                if deliver is not None:
                    with self._lock:
                        headers = dict(read.properties.headers or {})
                        self.deliveries.append(
                            (str(deliver.routing_key), deliver.redelivered, headers)
                        )
        self._buffers[connection] = buffer

    def of(self, queue: str) -> list[tuple[bool, dict[str, Any]]]:
        """The deliveries from ``queue`` so far: ``(redelivered, headers)``."""
        with self._lock:
            return [(again, headers) for name, again, headers in self.deliveries if name == queue]


@dataclass
class Rig:
    """One case's broker coordinates, proxy and tap."""

    url: str  # the tests' own URL of the case's vhost (the client's)
    in_queue: str
    out_queue: str
    proxy: TcpProxy
    tap: DeliveryTap
    markers: Path

    def env(self, base: dict[str, str], **overrides: str) -> dict[str, str]:
        """A worker's environment: ``base`` (``Queues.env``), through the proxy."""
        parts = urllib.parse.urlsplit(self.url)
        netloc = f"{parts.username}:{parts.password}@127.0.0.1:{self.proxy.port}"
        environment = dict(base)
        environment.update(
            BROKER_URL=urllib.parse.urlunsplit(parts._replace(netloc=netloc)),
            IN_QUEUE_NAME=self.in_queue,
            OUT_QUEUE_NAME=self.out_queue,
            ATW_TEST_MARKERS=str(self.markers),
            **overrides,
        )
        return environment

    def client(self) -> TaskClient:
        return TaskClient(
            url=self.url, service=SERVICE, in_queue=self.in_queue, out_queue=self.out_queue
        )

    def first_call_made(self, task_id: str) -> None:
        wait_for((self.markers / f"{task_id}.first").exists, 30, "the first call")

    async def observe(self, client: TaskClient, task_id: str) -> Cell:
        """The second delivery's headers and the attempt of the last ``started``."""
        reports = await asyncio.wait_for(_all(client, task_id), timeout=30)
        started = [report for report in reports if report.type == "started"]
        assert reports[-1].type == "success", [report.type for report in reports]
        deliveries = self.tap.of(self.in_queue)
        assert len(deliveries) >= 2, deliveries
        redelivered, headers = deliveries[1]
        return Cell(
            redelivered,
            headers.get("x-delivery-count"),
            headers.get("x-acquired-count"),
            started[-1].attempt,
        )


async def _all(client: TaskClient, task_id: str) -> list[Any]:
    return [report async for report in client.reports(task_id)]


@pytest.fixture
def rig(queues: Queues, markers: Path) -> Iterator[Rig]:
    """The case on the pass's broker, in the session's quorum vhost."""
    with proxied(queues.url, queues.in_queue, queues.out_queue, markers) as each:
        yield each


@contextlib.contextmanager
def proxied(url: str, in_queue: str, out_queue: str, markers: Path) -> Iterator[Rig]:
    """A :class:`Rig` whose proxy forwards to ``url``'s broker."""
    tap = DeliveryTap()
    parts = urllib.parse.urlsplit(url)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5672, tap) as proxy:
        yield Rig(url, in_queue, out_queue, proxy, tap, markers)


def check(case: str, seen: Cell, version: tuple[int, ...]) -> None:
    expected = EXPECTED[case][version_key(version)]
    assert seen == expected, f"{case} on {'.'.join(map(str, version))}: {seen}, not {expected}"


async def test_a_retryable_error(
    rig: Rig, queues: Queues, start_worker: Any, rabbitmq_version: tuple[int, ...]
) -> None:
    start_worker(TARGET, rig.env(queues.env()))
    async with rig.client() as client:
        task_id = await client.submit({"first": "retry"})
        seen = await rig.observe(client, task_id)
    check("retryable_error", seen, rabbitmq_version)


async def test_a_give_back_at_shutdown(
    rig: Rig, queues: Queues, start_worker: Any, rabbitmq_version: tuple[int, ...]
) -> None:
    env = rig.env(queues.env(), WORKER_SHUTDOWN_GRACE_S="0.2")
    first = start_worker(TARGET, env)
    async with rig.client() as client:
        task_id = await client.submit({"first": "sleep"})
        rig.first_call_made(task_id)
        first.signal(signal.SIGTERM)
        assert first.wait(timeout_s=30) == 0
        assert "outcome=shutdown_requeued action=nack-requeue" in first.log()
        start_worker(TARGET, env, wait_connected=False)
        seen = await rig.observe(client, task_id)
    check("give_back_at_shutdown", seen, rabbitmq_version)


@pytest.mark.skip(
    reason="unfinished: the output queue took the reports (3.10.8, session quorum vhost), so no "
    "hold ended in a give-back; EXPECTED's row for this case is not measured yet"
)
async def test_a_held_report_given_back(
    rig: Rig, queues: Queues, start_worker: Any, rabbitmq_version: tuple[int, ...]
) -> None:
    # The hold ends WORKER_CONSUMER_TIMEOUT_S - WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S (2 s)
    # after the delivery arrived; the output queue refuses every report until then.
    env = rig.env(
        queues.env(),
        WORKER_CONSUMER_TIMEOUT_S="3",
        WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S="1",
        WORKER_TASK_TIMEOUT_S="1",
    )
    worker = start_worker(TARGET, env)
    rabbitmqctl(
        "set_policy", "-p", queues.vhost, f"full-{queues.name}", f"^{queues.out_queue}$",
        '{"max-length": 1, "overflow": "reject-publish"}', "--priority", "1",
        "--apply-to", "queues",
    )  # fmt: skip
    wait_for(
        lambda: f"full-{queues.name}" in rabbitmqctl("list_queues", "-q", "-p", queues.vhost,
                                                      "name", "policy"),
        30, "the policy on the output queue",
    )  # fmt: skip
    await fill(rig.url, queues.out_queue)
    submitter = rig.client()  # it reads no reports: a reader would take the filler out
    await submitter.connect(reports=False)
    try:
        task_id = await submitter.submit({"first": "answer"})
    finally:
        await submitter.close()
    worker.wait_for_log("reason=report_held_until_consumer_timeout")
    rabbitmqctl("clear_policy", "-p", queues.vhost, f"full-{queues.name}")
    async with rig.client() as client:
        client.watch(task_id)
        seen = await rig.observe(client, task_id)
    check("held_report_given_back", seen, rabbitmq_version)


async def fill(url: str, queue: str) -> None:
    """One message in ``queue``, at its max length of 1: it refuses every report."""
    import aio_pika

    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.default_exchange.publish(aio_pika.Message(b"filler"), routing_key=queue)


async def test_a_crash(
    rig: Rig, queues: Queues, start_worker: Any, rabbitmq_version: tuple[int, ...]
) -> None:
    env = rig.env(queues.env())
    first = start_worker(TARGET, env)
    async with rig.client() as client:
        task_id = await client.submit({"first": "sleep"})
        rig.first_call_made(task_id)
        first.signal(signal.SIGKILL)
        first.wait()
        start_worker(TARGET, env, wait_connected=False)
        seen = await rig.observe(client, task_id)
    check("crash", seen, rabbitmq_version)


async def test_a_lost_connection(
    rig: Rig, queues: Queues, start_worker: Any, rabbitmq_version: tuple[int, ...]
) -> None:
    worker = start_worker(TARGET, rig.env(queues.env()))
    async with rig.client() as client:
        task_id = await client.submit({"first": "sleep"})
        rig.first_call_made(task_id)
        rig.proxy.cut()  # the worker's connections only: the client does not use the proxy
        seen = await rig.observe(client, task_id)
    assert worker.process.poll() is None  # it reconnected
    check("connection_loss", seen, rabbitmq_version)


#: How the consumer-timeout case provokes the broker's timeout, in one place: the node's own
#: ``consumer_timeout`` (3 s; 3.10 and 4.0 check it on the channel tick, set to 1 s), below the
#: worker's ``WORKER_CONSUMER_TIMEOUT_S`` (the default, 30 min), while the first call sleeps.
#: Once the worker asks 4.3 for its own ``x-consumer-timeout``, 4.3 needs the worker's setting
#: lowered instead (a task that outlives the worker's own timeout).
CONSUMER_TIMEOUT_CONF = {"consumer_timeout": "3000"}
CONSUMER_TIMEOUT_ADVANCED = "[{rabbit, [{channel_tick_interval, 1000}]}]."
CONSUMER_TIMEOUT_WORKER: dict[str, str] = {}


@pytest.fixture
def timeout_node(rabbitmq_version: tuple[int, ...]) -> Iterator[Node]:
    """A node of the pass's version with a 3 s consumer timeout."""
    version = "3.10" if rabbitmq_version < (4, 0) else "4.0"  # 4.x: ATW_RABBITMQ4_ROOT's
    if version == "4.0" and not root_ready(default_root()):
        pytest.skip(f"no RabbitMQ 4 root at {default_root()} (ATW_RABBITMQ4_ROOT)")
    spec = NodeSpec(
        name=node_name("atw-count"), port=node_port(), version=version,
        epmd_port=free_port() if version == "4.0" else NodeSpec.epmd_port,
        conf=CONSUMER_TIMEOUT_CONF, advanced_config=CONSUMER_TIMEOUT_ADVANCED,
    )  # fmt: skip
    node = Node(spec)
    try:
        node.start(fresh=True)
        own = tuple(int(part) for part in node.server_version().split(".")[:2])
        if version_key(own) != version_key(rabbitmq_version):
            pytest.fail(
                f"the node of the case's own runs {node.server_version()}, the pass's broker "
                f"{'.'.join(map(str, rabbitmq_version))}: point ATW_RABBITMQ4_ROOT at its root"
            )
        yield node
    finally:
        node.remove()


async def test_a_consumer_timeout(
    request: pytest.FixtureRequest,
    timeout_node: Node,
    queues: Queues,
    markers: Path,
    start_worker: Any,
    *,
    rabbitmq_version: tuple[int, ...],
) -> None:
    if rabbitmq_version >= (4, 3):
        # 4.3 cancels the consumer (basic.cancel) instead of closing the channel, and
        # aio-pika's robust channel consumes again with the same tag: 530 NOT_ALLOWED, a loop.
        # The transport's fix is under way; remove this mark with it.
        request.applymarker(
            pytest.mark.xfail(
                reason="4.3: aio-pika reuses the cancelled consumer tag (530)", strict=False
            )
        )
    vhost = f"atw-count-{uuid.uuid4().hex[:8]}"
    timeout_node.ctl("add_vhost", vhost, "--default-queue-type", "quorum")
    timeout_node.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    timeout_node.ctl(
        "set_policy", "-p", vhost, "delivery-limit", ".*", json.dumps({"delivery-limit": 20}),
        "--apply-to", "queues",
    )  # fmt: skip
    with proxied(timeout_node.url(vhost), queues.in_queue, queues.out_queue, markers) as rig:
        start_worker(TARGET, rig.env(queues.env(), **CONSUMER_TIMEOUT_WORKER))
        async with rig.client() as client:
            task_id = await client.submit({"first": "sleep"})
            seen = await rig.observe(client, task_id)
        check("consumer_timeout", seen, rabbitmq_version)
