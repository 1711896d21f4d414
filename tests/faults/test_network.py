"""Network faults: a silent partition through a proxy, and a cluster node that stops."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from async_task_api_worker.client import build_envelope
from async_task_api_worker.settings import SILENT_HEARTBEATS_TO_DEAD
from async_task_api_worker.transports.rabbitmq.link import SECOND_LOOK_S
from scripts.rabbitmq_nodes import Node, running_cluster
from tests.faults.conftest import Broker, version_spec
from tests.faults.ledger import CONNECT_TIMEOUT_S, Case, Ledger, Supervisor, worker_env
from tests.faults.test_pushback import publish_held, ready_status
from tests.integration.conftest import BROKER_HOST, BROKER_PORT
from tests.integration.tcp_proxy import TcpProxy
from tests.polling import until
from tests.ports import node_name, node_port

TARGET = "tests.faults.workers:steady"
HEARTBEAT_S = 5
#: The watchdog looks every min(1, heartbeat / 4) s and drops a connection silent for two
#: heartbeats, on a second look (transports/rabbitmq/link.py); one more second for the scheduler.
DETECTION_BOUND_S = (
    SILENT_HEARTBEATS_TO_DEAD * HEARTBEAT_S + min(1.0, HEARTBEAT_S / 4) + SECOND_LOOK_S + 1.0
)
PARTITION_S = 60.0


@pytest.mark.timeout(300)
async def test_a_silent_partition_is_seen_within_two_heartbeats_and_nothing_is_lost(
    machine_broker: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    case = Case(machine_broker, "part", markers, tmp_path)
    with TcpProxy(BROKER_HOST, BROKER_PORT) as proxy:
        through_proxy = case.url.replace(f":{BROKER_PORT}/", f":{proxy.port}/")
        worker = case.worker
        worker.env.update(BROKER_URL=through_proxy, BROKER_HEARTBEAT_S=str(HEARTBEAT_S))
        worker.start()
        ids = await case.publish(12, {"seconds": 4.0})
        # Four tasks in flight (their handlers' marker files).
        await until(lambda: len(list(markers.iterdir())) >= 4, 60, "four tasks in flight")
        proxy.pause()
        paused, paused_wall = time.monotonic(), time.time()
        first_503: float | None = None
        ready_after_503: list[int] = []
        while time.monotonic() - paused < PARTITION_S:
            status, _ = ready_status(worker.probes)
            if status == 503 and first_503 is None:
                first_503 = time.monotonic() - paused
            elif first_503 is not None:
                ready_after_503.append(status)
            await asyncio.sleep(1.0)  # readiness sampled once a second through the partition
        proxy.resume()
        counts = await case.settle(ids, timeout_s=90)
    drops = [
        datetime.fromisoformat(json.loads(line)["ts"]).timestamp() - paused_wall
        for line in worker.log().splitlines()
        if "No frame from" in line
    ]
    detected = min(drops, default=float("inf"))
    record(
        counts.row(
            "silent partition of 60 s (TCP proxy), heartbeat 5 s",
            broker=machine_broker.label,
            measured=(
                f"/ready 503 after {first_503:.1f} s, the connection dropped after "
                f"{detected:.1f} s (bound {DETECTION_BOUND_S:g} s)"
                if first_503 is not None
                else ""
            ),
        )
    )
    assert first_503 is not None and first_503 <= HEARTBEAT_S + 2.0
    assert set(ready_after_503) == {503}, ready_after_503
    assert detected <= DETECTION_BOUND_S
    counts.assert_intact()
    assert counts.codes == {"success": 12}


@contextlib.asynccontextmanager
async def steady_stream(
    urls: Sequence[str], queue: str, every_s: float
) -> AsyncIterator[list[tuple[float, str]]]:
    """Publish a task every ``every_s`` seconds until the block ends; ``(time, id)`` of each
    confirmed. When a node goes, the next of ``urls`` is used (a publish is given up after
    ``CONNECT_TIMEOUT_S``: its task counts only if it was confirmed)."""
    published: list[tuple[float, str]] = []
    # The loop's own end: a cancel can be lost when closing a connection then fails (the
    # failure replaces the CancelledError, and is suppressed below): it published on for good.
    ending = asyncio.Event()

    async def publish() -> None:
        for url in itertools.cycle(urls):
            if ending.is_set():
                return
            with contextlib.suppress(Exception):
                connection = await asyncio.wait_for(aio_pika.connect(url), CONNECT_TIMEOUT_S)
                async with connection:
                    channel = await connection.channel(publisher_confirms=True)
                    while not ending.is_set():
                        task_id, body = build_envelope({"seconds": 0.0}, service="steady")
                        message = aio_pika.Message(
                            body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                        )
                        await asyncio.wait_for(
                            channel.default_exchange.publish(message, routing_key=queue),
                            CONNECT_TIMEOUT_S,
                        )
                        published.append((time.monotonic(), task_id))
                        await asyncio.sleep(every_s)
            await asyncio.sleep(every_s)

    task = asyncio.create_task(publish())
    try:
        yield published
    finally:
        ending.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def resumed_after(
    ledger: Ledger, published: list[tuple[float, str]], since: float, stopped: float
) -> float:
    """Seconds from ``stopped`` to the first success of a task published after ``since``."""
    after = {task_id for at, task_id in published if at >= since}
    for at, task_id, kind in ledger.arrivals:
        if kind == "success" and task_id in after:
            return max(0.0, at - stopped)
    return float("inf")


async def wait_resumed(
    ledger: Ledger,
    published: list[tuple[float, str]],
    since: float,
    stopped: float | None = None,
    timeout_s: float = 60,
) -> float:
    """Wait for work to resume after a stop that began at ``since`` and ended at ``stopped``."""
    deadline = time.monotonic() + timeout_s
    while (gap := resumed_after(ledger, published, since, stopped or since)) == float("inf"):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    return gap


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "shape",
    [
        pytest.param(("3.10", TARGET, False), id="3.10"),
        # Issue 29's acceptance: every node restarted in turn, tasks in processes of their own.
        pytest.param(
            ("4.3", "tests.faults.workers:isolated", True), id="4.3", marks=pytest.mark.faults4
        ),
    ],
)
async def test_a_stopped_cluster_node_costs_seconds_with_two_urls(
    shape: tuple[str, str, bool], markers: Path, tmp_path: Path, record: Any
) -> None:
    version, target, rolling = shape  # the broker, the worker, a rolling restart or not
    taken: set[int] = set()
    members = [(node_name(f"atw-fault-c{i}"), node_port(taken)) for i in range(1, 4)]
    with running_cluster(members, **version_spec(version)) as nodes:
        first, second, third = nodes
        broker = Broker(label=f"{first.server_version()} cluster of 3", node=first)
        vhost = broker.vhost()
        # The input queue is declared through the third node, so that its leader is there,
        # away from the nodes the worker knows.
        third_url, second_url = third.url(vhost), second.url(vhost)
        connection = await aio_pika.connect(third_url)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue("ha_in", durable=True)
        leader = first.leader_of("ha_in", vhost)
        env = worker_env(f"{first.url(vhost)},{second_url}", "ha", markers)
        worker = Supervisor(target, env, tmp_path)
        worker.start()
        ledger = Ledger()
        leader_node = _node_named(nodes, leader)
        assert leader_node is not first
        # The queue leader's node, then the worker's; in a rolling restart, then the last one
        # too, each started again before the next one stops.
        order = [leader_node, first] + (
            [n for n in nodes if n not in (leader_node, first)] * rolling
        )
        gaps: list[tuple[float, float]] = []  # (from the stop's start, from the node's end)
        # The publisher and the reader move to the third node when the second one stops.
        async with (
            ledger.consuming([second_url, third_url], "ha_out"),
            steady_stream([second_url, third_url], "ha_in", 0.05) as published,
        ):
            await wait_resumed(ledger, published, time.monotonic())
            for step, stopped_node in enumerate(order):
                stopping = time.monotonic()
                stopped_node.stop()  # returns once the node's process has ended
                gap = await wait_resumed(ledger, published, stopping, time.monotonic())
                gaps.append((await wait_resumed(ledger, published, stopping), gap))
                if rolling or step == 0:
                    stopped_node.start()
            await asyncio.sleep(2)  # two more seconds of traffic on the surviving nodes
        ids = [task_id for _, task_id in published]
        reader_url = third_url if rolling else second_url
        await ledger.read(reader_url, "ha_out", ids, timeout_s=60)
        counts = ledger.count(ids, markers, Broker("", node=second).hung(vhost, "ha_in"))
        assert worker.stop() == 0
        names = ["leader's node", "worker's node", "last node"]
        measured = "; ".join(
            f"{name}: work resumed {from_stop:.1f} s after `stop` began, {gap:.1f} s after "
            "the node was down"
            for name, (from_stop, gap) in zip(names, gaps, strict=False)
        )
        case = (
            "cluster of 3, rolling restart (leader's node, worker's, last), process-isolated "
            "tasks (2 URLs)"
            if rolling
            else "cluster of 3: the queue leader's node stopped, then the worker's (2 URLs)"
        )
        record(counts.row(case, broker=broker.label, measured=measured))
        counts.assert_intact(duplicates_at_most=4 * len(order))  # in flight at each node stop
        if not rolling:
            assert gaps[0][1] <= 2.0
            assert gaps[1][1] <= 5.0


def _node_named(nodes: list[Node], name: str) -> Node:
    for node in nodes:
        if node.nodename == name:
            return node
    raise LookupError(name)


@pytest.mark.timeout(120)
async def test_a_urls_own_heartbeat_is_the_one_the_watchdog_keeps(
    machine_broker: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    # The broker sends nothing on an idle connection without heartbeats: a watchdog that
    # expected BROKER_HEARTBEAT_S would drop it, and withdraw the task, every 4 s.
    case = Case(machine_broker, "hb0", markers, tmp_path)
    case.worker.env.update(BROKER_URL=f"{case.url}?heartbeat=0", BROKER_HEARTBEAT_S="2")
    case.worker.start()
    ids = await case.publish(2, {"seconds": 10.0})
    counts = await case.settle(ids, timeout_s=60)
    record(
        counts.row(
            "?heartbeat=0 in BROKER_URL, BROKER_HEARTBEAT_S=2, tasks of 10 s",
            broker=machine_broker.label,
            measured="no connection dropped",
        )
    )
    counts.assert_intact()
    assert counts.codes == {"success": 2} and counts.handler_runs == 2
    assert "No frame from the broker" not in case.worker.log()


@pytest.mark.timeout(300)
async def test_a_partition_during_a_memory_alarm_loses_nothing(
    node_310: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    assert node_310.node is not None
    case = Case(node_310, "alarmpart", markers, tmp_path)
    with TcpProxy("127.0.0.1", node_310.node.port) as proxy:
        through_proxy = case.url.replace(f":{node_310.node.port}/", f":{proxy.port}/")
        case.worker.env.update(BROKER_URL=through_proxy, BROKER_HEARTBEAT_S=str(HEARTBEAT_S))
        case.worker.start()
        ids, release = await publish_held(case, 12)
        node_310.node.set_memory_alarm(True)
        release.touch()
        case.worker.wait_for("was blocked by")
        proxy.pause()
        case.worker.wait_for("No frame from the broker", timeout_s=DETECTION_BOUND_S + 5)
        await asyncio.sleep(5)  # the partition goes on past the detection, then heals
        proxy.resume()
        node_310.node.set_memory_alarm(False)
        counts = await case.settle(ids, timeout_s=90)
    record(
        counts.row(
            "memory alarm, then a partition of the blocked connections",
            broker=node_310.label,
        )
    )
    counts.assert_intact(duplicates_at_most=4)  # in flight when the connection died
    assert counts.codes == {"success": 12}
