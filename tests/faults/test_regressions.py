"""The faults the worker already survived, as rows of the table: kill -9, a broker restart, a
forced disconnect, SIGTERM under load, malformed bodies, and a quorum queue with arguments."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from tests.faults.conftest import Broker, on_versions
from tests.faults.ledger import Case
from tests.polling import until


async def until_markers(markers: Path, count: int) -> None:
    """Wait until the handlers have been called ``count`` times in all (their marker files)."""
    await until(lambda: len(list(markers.iterdir())) >= count, 120, f"{count} handler calls")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("node", on_versions("machine", "4.3"), indirect=True)
async def test_kill_9_mid_run_three_times(
    node: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    case = Case(node, "kill", markers, tmp_path)
    case.worker.start()
    ids = await case.publish(20, {"seconds": 1.0})
    for calls in (4, 10, 16):
        await until_markers(markers, calls)
        case.worker.kill9()
    counts = await case.settle(ids)
    record(counts.row("kill -9 of the worker mid-run, 3 times", broker=node.label))
    # Only a success confirmed and not yet acked when its worker died can be reported twice.
    counts.assert_intact(duplicates_at_most=3 * 4)


@pytest.mark.timeout(300)
async def test_a_broker_restart_mid_run(
    node_310: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    assert node_310.node is not None
    case = Case(node_310, "restart", markers, tmp_path)
    case.worker.start()
    ids = await case.publish(20, {"seconds": 1.0})
    await until_markers(markers, 6)
    node_310.node.restart()
    counts = await case.settle(ids)
    record(counts.row("broker restart mid-run", broker=node_310.label))
    counts.assert_intact(duplicates_at_most=4)


@pytest.mark.timeout(300)
async def test_forced_disconnects_mid_run(
    machine_broker: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    case = Case(machine_broker, "forced", markers, tmp_path)
    case.worker.start()
    ids = await case.publish(20, {"seconds": 1.0})
    for calls in (4, 12):
        await until_markers(markers, calls)
        machine_broker.ctl("close_all_connections", "-p", case.vhost, "fault suite")
    counts = await case.settle(ids)
    record(
        counts.row("forced disconnect (close_all_connections), twice", broker=machine_broker.label)
    )
    counts.assert_intact(duplicates_at_most=2 * 4)


@pytest.mark.timeout(300)
async def test_sigterm_under_load_then_a_new_worker(
    machine_broker: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    case = Case(machine_broker, "term", markers, tmp_path, env={"WORKER_SHUTDOWN_GRACE_S": "1"})
    case.worker.start()
    ids = await case.publish(20, {"seconds": 3.0})
    await until_markers(markers, 4)
    case.worker.current.send_signal(signal.SIGTERM)
    exit_code = case.worker.current.wait(60)
    case.worker.keep_running()  # the supervisor starts the next one
    counts = await case.settle(ids)
    record(
        counts.row(
            "SIGTERM with 4 tasks in flight, grace 1 s",
            broker=machine_broker.label,
            measured=f"exit {exit_code}",
        )
    )
    assert exit_code == 0
    counts.assert_intact()


@pytest.mark.timeout(300)
async def test_malformed_bodies_are_reported_or_dead_lettered_and_the_rest_runs(
    machine_broker: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    case = Case(machine_broker, "bad", markers, tmp_path)
    case.worker.start()
    connection = await aio_pika.connect(case.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        bad_ids = [f"bad-{n}" for n in range(5)]
        bodies = [b"\xff\xfe not json", b"[]", b'{"task_id": 5}', b"{" * 100_000, b""]
        bodies += [
            f'{{"protocol_version":1,"task_id":"{task_id}","client_id":"c","service":"elsewhere",'
            f'"input":{{}}}}'.encode()
            for task_id in bad_ids
        ]
        for body in bodies:
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key="bad_in")
    ids = await case.publish(10, {"seconds": 0.1})
    assert case.worker.current.poll() is None  # never crashed
    counts = await case.settle(ids + bad_ids, timeout_s=60)
    assert case.worker.restarts == 0
    record(
        counts.row(
            "10 malformed bodies (5 without a task id) among 10 tasks",
            broker=machine_broker.label,
            measured="5 without a task id rejected (dead-lettered where a DLX is set)",
        )
    )
    counts.assert_intact()
    assert counts.codes == {"success": 10, "POISON_MESSAGE": 5}


@pytest.mark.timeout(300)
async def test_a_quorum_queue_with_a_delivery_limit_argument_counts_attempts(
    machine_broker: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    case = Case(
        machine_broker, "limit", markers, tmp_path, "tests.faults.workers:crashy", quorum=False
    )
    connection = await aio_pika.connect(case.url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(
            "limit_in",
            durable=True,
            arguments={"x-queue-type": "quorum", "x-delivery-limit": 10},
        )
    case.worker.start()
    ids = await case.publish(1, {"seconds": 600}, service="crashy")
    for calls in (1, 2):
        await until_markers(markers, calls)
        case.worker.kill9()
    counts = await case.settle(ids, timeout_s=60)
    attempts = sorted(int(marker.name.split(".")[1]) for marker in markers.iterdir())
    record(
        counts.row(
            "quorum queue with x-delivery-limit, kill -9 twice",
            broker=machine_broker.label,
            measured=f"attempts {attempts}",
        )
    )
    assert attempts == [1, 2, 3]
    counts.assert_intact()
    assert counts.codes == {"success": 1}
    log = case.worker.log()
    assert "is not a quorum queue" not in log
    # The plain declare's mismatch is logged as the broker names it.
    assert "Queue limit_in exists with arguments" in log and "inequivalent arg '" in log


#: A node whose own consumer timeout (10 s) is far shorter than the tasks (40 s, timeout 120 s).
SHORT_NODE_TIMEOUT = {"conf": {"consumer_timeout": "10000"}}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("node", on_versions("4.3", **SHORT_NODE_TIMEOUT), indirect=True)
async def test_tasks_longer_than_the_nodes_consumer_timeout(
    node: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    # RabbitMQ 4.3 takes the worker's own consumer timeout (x-consumer-timeout, from the task's
    # budget): no broker setting is changed for a task that outlives the node's.
    case = Case(node, "long", markers, tmp_path, env={"WORKER_TASK_TIMEOUT_S": "120"})
    case.worker.start()
    ids = await case.publish(2, {"seconds": 40.0})
    counts = await case.settle(ids)
    log = case.worker.log()
    cancels = log.count("The broker cancelled the consumer")
    record(
        counts.row(
            "the node's consumer_timeout 10 s, tasks of 40 s (timeout 120 s)",
            broker=node.label,
            measured=f"attempts {sorted({a for i in ids for a in counts.attempts[i]})}, "
            f"{cancels} consumer cancels",
        )
    )
    counts.assert_intact()
    assert counts.handler_runs == 2
    assert all(counts.attempts[task_id] == [1] for task_id in ids)
    assert "a consumer timeout of the worker's own, 1800 s" in log
    assert cancels == 0
