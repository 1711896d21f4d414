"""What each RabbitMQ version counts, measured with the real worker on the pass's broker.

A task's first call does something that sends its delivery back (a ``RetryableError``, a
give-back at shutdown, a report held until it is given back, a consumer timeout, a crash, a lost
connection); the worker reaches the broker through a TCP proxy of the tests' own that reads the
frames the broker sends it, so each case sees what the redelivery carried (``redelivered``,
``x-delivery-count``, ``x-acquired-count``) and the attempt the worker reported for it (the
``started`` report). :data:`EXPECTED` holds both per version (docs/brokers.md, "Attempt counting
per version", is this table). The consumer-timeout case needs a node of its own before 4.3 (the
broker's ``consumer_timeout`` is node-wide): it starts one of the pass's version. On 4.3 the
worker asks for its own timeout, and the case runs on the pass's broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from async_task_api_worker.client import TaskClient
from async_task_api_worker.settings import load_settings
from scripts.rabbitmq_nodes import Node, NodeSpec, default_root, root_ready
from tests.integration.conftest import Queues, rabbitmqctl
from tests.integration.counting_workers import counting
from tests.integration.delivery_tap import DeliveryTap
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


#: Per case, per version: measured on 3.10.8, 4.0.5 and 4.3.6 (docs/brokers.md), every row by its
#: test below. A 4.3 redelivery after a give-back (at shutdown, or of a held report) or a
#: consumer timeout carries no x-delivery-count: attempt 1 again. Each cell is the SECOND
#: delivery and the attempt of the last ``started``: a first attempt whose report also got out
#: (a loop blocked past the timeout can report twice) is not what the table claims.
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
    "held_report_given_back": {  # the hold's end is a give-back: basic.nack(requeue)
        "3.10": Cell(True, 1, None, 2),
        "4.0": Cell(True, 1, None, 2),
        "4.3": Cell(True, None, 1, 1),
    },
    "consumer_timeout": {  # 4.3: the worker's own timeout, then a fresh consumer tag
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


#: The held-report case's worker, inside the time budget of every version: task timeout 1 s +
#: cancel grace 1 s + report confirm 2 s + check interval 1 s = 5 s under a consumer timeout of
#: 20 s (``broker_rules``), so a refused report holds its delivery 20 - 1 = 19 s
#: (``WorkerSettings.delivery_hold_s``), then it is given back. The next hand-out's hold is as
#: long: time for the test to empty the output queue and lift its limit (two ``rabbitmqctl``
#: calls, seconds each on a loaded machine: with a 5 s hold, CI's 4.3 pass once saw a second
#: give-back before the limit was gone).
HOLD_WORKER = {
    "WORKER_TASK_TIMEOUT_S": "1",
    "WORKER_RETRY_BACKOFF_S": "0",
    "WORKER_RETRY_BACKOFF_MAX_S": "0",
    "WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S": "1",
    "WORKER_CONSUMER_TIMEOUT_S": "20",
}
HOLD_GIVEN_BACK = "reason=report_held_until_consumer_timeout"
_HOLD_SETTINGS = load_settings(
    {name.lower(): value for name, value in HOLD_WORKER.items()}, read_environment=False
)
#: How long the worker holds a refused report's delivery (19 s), from the settings above.
HOLD_S = _HOLD_SETTINGS.delivery_hold_s(
    _HOLD_SETTINGS.task_timeout_s(counting.task_definition.timeout_s)
)


@pytest.mark.timeout(120)  # two holds of 19 s, and the broker's CLI on a loaded machine
async def test_a_held_report_given_back(
    rig: Rig, queues: Queues, start_worker: Any, rabbitmq_version: tuple[int, ...]
) -> None:
    worker = start_worker(TARGET, rig.env(queues.env(), **HOLD_WORKER))
    policy = f"full-{queues.name}"
    rabbitmqctl(
        "set_policy", "-p", queues.vhost, policy, f"^{queues.out_queue}$",
        '{"max-length": 1, "overflow": "reject-publish"}', "--priority", "1",
        "--apply-to", "queues",
    )  # fmt: skip
    wait_for(
        lambda: policy in rabbitmqctl("list_queues", "-q", "-p", queues.vhost, "name", "policy"),
        30, "the policy on the output queue",
    )  # fmt: skip
    await fill(rig.url, queues.out_queue)
    submitter = rig.client()  # it reads no reports: a reader would take a filler out
    await submitter.connect(reports=False)
    try:
        task_id = await submitter.submit({"first": "answer"})
    finally:
        await submitter.close()
    # The give-back comes HOLD_S after the hand-out: the wait's slack is the loaded machine's.
    worker.wait_for_log(HOLD_GIVEN_BACK, timeout_s=HOLD_S + 30)
    # Empty first, then lift the limit: the redelivery's reports (held and retried meanwhile)
    # land after the purge, which takes only fillers.
    rabbitmqctl("purge_queue", "-p", queues.vhost, queues.out_queue)
    rabbitmqctl("clear_policy", "-p", queues.vhost, policy)
    async with rig.client() as client:
        client.watch(task_id)
        seen = await rig.observe(client, task_id)
    assert worker.log().count(HOLD_GIVEN_BACK) == 1  # the second delivery's reports got out
    check("held_report_given_back", seen, rabbitmq_version)


async def fill(url: str, queue: str) -> None:
    """Publish to ``queue`` (max length 1, ``reject-publish``) until it refuses one.

    A quorum queue refuses only once it is over its max length: at max length 1, 3.10.8
    confirmed two publishes and nacked the third, so the one filler of old left room for a
    report, which the broker took.
    """
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for _ in range(3):
            try:
                await channel.default_exchange.publish(
                    aio_pika.Message(b"filler"), routing_key=queue
                )
            except aio_pika.exceptions.DeliveryError:
                return
    raise AssertionError(f"{queue} took 3 publishes at max length 1")


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


#: How the consumer-timeout case provokes the broker's timeout, per version, in one place.
#: 3.10 and 4.0: the node's own ``consumer_timeout`` (3 s, checked on a channel tick of 1 s),
#: below the worker's ``WORKER_CONSUMER_TIMEOUT_S`` (the default, 30 min), while the first call
#: sleeps; the broker closes the channel. 4.3 takes the worker's own ``x-consumer-timeout``
#: instead of the node's, on any 4.3 node: task timeout 2 s + cancel grace 1 s + report confirm
#: 2 s + check interval 1 s = 6 s, over ``WORKER_CONSUMER_TIMEOUT_S`` 5 s, asks for 6 + 1 = 7 s
#: (``broker_rules.consumer_timeout_s``); a first call that blocks the event loop 2 s past it is
#: cancelled (``basic.cancel``), and the worker consumes again with a fresh tag.
CONSUMER_TIMEOUT_CONF = {"consumer_timeout": "3000"}
CONSUMER_TIMEOUT_ADVANCED = "[{rabbit, [{channel_tick_interval, 1000}]}]."
CONSUMER_TIMEOUT_WORKER: dict[str, dict[str, str]] = {
    "3.10": {},
    "4.0": {},
    "4.3": {
        "WORKER_TASK_TIMEOUT_S": "2",
        "WORKER_RETRY_BACKOFF_S": "0",
        "WORKER_RETRY_BACKOFF_MAX_S": "0",
        "WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S": "1",
        "WORKER_CONSUMER_TIMEOUT_S": "5",
    },
}
CONSUMER_TIMEOUT_OWN_S = 7  # 4.3: what the worker asks for, as its "Connected to" line says
CONSUMER_TIMEOUT_PLAN: dict[str, dict[str, object]] = {
    "3.10": {"first": "sleep"},
    "4.0": {"first": "sleep"},
    "4.3": {"first": "block", "block_s": CONSUMER_TIMEOUT_OWN_S + 2},
}


@pytest.fixture
def timeout_url(queues: Queues, rabbitmq_version: tuple[int, ...]) -> Iterator[str]:
    """The URL of a quorum vhost whose broker times a sleeping delivery out.

    4.3: the pass's own (the worker's own timeout applies on any 4.3 node). 3.10 and 4.0: a
    node of the pass's version with :data:`CONSUMER_TIMEOUT_CONF`, node-wide before 4.3.
    """
    version = version_key(rabbitmq_version)
    if version == "4.3":
        yield queues.url
        return
    if version == "4.0" and not root_ready(default_root("4.0")):
        pytest.skip(f"no RabbitMQ 4.0 root at {default_root('4.0')} (ATW_RABBITMQ4_ROOT)")
    spec = NodeSpec(
        name=node_name("atw-count"), port=node_port(), version=version,
        epmd_port=free_port() if version == "4.0" else NodeSpec.epmd_port,
        conf=CONSUMER_TIMEOUT_CONF, advanced_config=CONSUMER_TIMEOUT_ADVANCED,
    )  # fmt: skip
    node = Node(spec)
    try:
        node.start(fresh=True)
        own = tuple(int(part) for part in node.server_version().split(".")[:2])
        if version_key(own) != version:
            pytest.fail(
                f"the node of the case's own runs {node.server_version()}, the pass's broker "
                f"{'.'.join(map(str, rabbitmq_version))}: point ATW_RABBITMQ4_ROOT at its root"
            )
        vhost = f"atw-count-{uuid.uuid4().hex[:8]}"
        node.ctl("add_vhost", vhost, "--default-queue-type", "quorum")
        node.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        node.ctl(
            "set_policy", "-p", vhost, "delivery-limit", ".*",
            json.dumps({"delivery-limit": 20}), "--apply-to", "queues",
        )  # fmt: skip
        yield node.url(vhost)
    finally:
        node.remove()


async def test_a_consumer_timeout(
    timeout_url: str,
    queues: Queues,
    markers: Path,
    start_worker: Any,
    rabbitmq_version: tuple[int, ...],
) -> None:
    version = version_key(rabbitmq_version)
    with proxied(timeout_url, queues.in_queue, queues.out_queue, markers) as rig:
        worker = start_worker(TARGET, rig.env(queues.env(), **CONSUMER_TIMEOUT_WORKER[version]))
        if version == "4.3":
            own = f"a consumer timeout of the worker's own, {CONSUMER_TIMEOUT_OWN_S} s"
            assert own in worker.log()
        async with rig.client() as client:
            task_id = await client.submit(CONSUMER_TIMEOUT_PLAN[version])
            seen = await rig.observe(client, task_id)
        if version == "4.3":
            assert f"(a consumer timeout of {CONSUMER_TIMEOUT_OWN_S} s)" in worker.log()
        check("consumer_timeout", seen, rabbitmq_version)
