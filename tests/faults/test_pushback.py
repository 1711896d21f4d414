"""The broker pushes back on reports: a full output queue, a memory alarm, a size limit.

Before this suite, a report refused for longer than ``WORKER_DELIVERY_LIMIT`` x
``WORKER_RETRY_BACKOFF_MAX_S`` cost its task: every give-back counted (before RabbitMQ 4.3),
and the task was abandoned with a failure that could not be published either.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.faults.conftest import Broker, on_versions
from tests.faults.ledger import Case, decisions
from tests.polling import until

#: Longer than the worker's delivery limit (3) x WORKER_RETRY_BACKOFF_MAX_S (2 s): the outage
#: that used to abandon tasks.
OUTAGE_S = 15.0
#: The output outage of issue 29's acceptance (RabbitMQ 4.3 rows).
LONG_OUTAGE_S = 60.0
#: Nodes whose ``max_message_size`` is 1 MiB (read at node start: a node of the case's own).
SIZE_LIMITED = on_versions("3.10", "4.0", "4.3", conf={"max_message_size": "1048576"})


def ready_status(probes: str) -> tuple[int, dict[str, Any]]:
    """``GET /ready``: the status code and the JSON body."""
    try:
        with urllib.request.urlopen(f"{probes}/ready", timeout=5) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


async def publish_held(case: Case, tasks: int) -> tuple[list[str], Path]:
    """Publish ``tasks`` that wait for a release file, and wait until the worker holds as many
    as it runs at once; the ids and the file. A fault raised before the file is written is
    met by every terminal report, however long the fault took to raise on a loaded machine."""
    release = case.logs / "release"
    ids = await case.publish(tasks, {"seconds": 0.5, "release": str(release)})
    in_flight = int(case.worker.env["WORKER_CONCURRENCY"])
    await until(lambda: len(list(case.markers.iterdir())) >= in_flight, 60, "tasks in flight")
    return ids, release


async def fill_output_queue(broker: Broker, vhost: str, queue: str) -> None:
    """Make ``queue`` refuse every publish: max length 1, ``reject-publish``, one message in."""
    broker.ctl(
        "set_policy", "-p", vhost, "full", f"^{queue}$",
        '{"max-length": 1, "overflow": "reject-publish"}', "--priority", "1",
        "--apply-to", "queues",
    )  # fmt: skip
    import aio_pika

    connection = await aio_pika.connect(broker.url(vhost))
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue, passive=True)
        await channel.default_exchange.publish(aio_pika.Message(b"filler"), routing_key=queue)


async def full_queue_outage(
    case: Case,
    broker: Broker,
    tasks: int,
    task_input: dict[str, Any],
    seen: str,
    *,
    outage_s: float = OUTAGE_S,
) -> tuple[list[str], float]:
    """Fill the output queue, publish ``tasks``, hold it full ``outage_s`` once the worker
    logs ``seen``, then free it; the task ids, and when it was freed (monotonic)."""
    case.worker.start()
    await fill_output_queue(broker, case.vhost, case.out_queue)
    ids = await case.publish(tasks, task_input)
    case.worker.wait_for(seen)
    await asyncio.sleep(outage_s)
    broker.ctl("clear_policy", "-p", case.vhost, "full")
    return ids, time.monotonic()


def last_terminal_at(case: Case) -> float:
    """When the last terminal report reached the ledger (monotonic)."""
    return max(at for at, _, kind in case.ledger.arrivals if kind in ("success", "failure"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("node", "outage_s"),
    [  # on 4.3, the 60 s outage of issue 29's acceptance
        pytest.param(
            *p.values, LONG_OUTAGE_S if p.id == "4.3" else OUTAGE_S, id=p.id, marks=p.marks
        )
        for p in on_versions("3.10", "4.0", "4.3")
    ],
    indirect=["node"],
)
async def test_reports_refused_by_a_full_output_queue_are_held_not_lost(
    node: Broker, outage_s: float, markers: Path, tmp_path: Path, record: Any
) -> None:
    broker = node
    case = Case(broker, "full", markers, tmp_path)
    ids, freed = await full_queue_outage(
        case, broker, 12, {"seconds": 0.2}, "was not confirmed by the broker", outage_s=outage_s
    )
    counts = await case.settle(ids, timeout_s=60)
    last = last_terminal_at(case)
    record(
        counts.row(
            f"output queue full (reject-publish) for {outage_s:g} s, then freed",
            broker=broker.label,
            measured=f"all reported {last - freed:.1f} s after; every report from attempt 1",
        )
    )
    counts.assert_intact()
    assert counts.codes == {"success": 12}
    # Refused again and again, the reports moved to a fresh channel (3.10's stuck quorum queue).
    assert "publishing on a fresh channel" in case.worker.log()
    # Held, never given back: no task needed a second attempt.
    assert all(attempts == [1] for attempts in counts.attempts.values())
    assert counts.handler_runs == 12


@pytest.mark.timeout(300)
@pytest.mark.parametrize("node", on_versions("3.10", "4.0"), indirect=True)
async def test_a_full_output_queue_at_concurrency_32_swaps_channels_and_hangs_no_report(
    node: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    """Refusals pile up past the fresh channel and the fresh connection with 32 tasks held.

    A report that waited for its turn while the channel was swapped used to wait for good on
    the old channel (closed on purpose, never reopened), and every report behind it: the
    worker held its 32 deliveries until the consumer timeout.
    """
    broker = node
    case = Case(broker, "fullc32", markers, tmp_path, env={"WORKER_CONCURRENCY": "32"})
    ids, freed = await full_queue_outage(
        case, broker, 200, {"seconds": 0.05}, "publishing on a fresh connection"
    )
    counts = await case.settle(ids, timeout_s=120)
    last = last_terminal_at(case)
    record(
        counts.row(
            "output queue full (reject-publish) for 15 s at concurrency 32, 200 tasks",
            broker=broker.label,
            measured=f"all reported {last - freed:.1f} s after; fresh channels and connections",
        )
    )
    counts.assert_intact()
    assert counts.codes == {"success": 200}


@pytest.mark.timeout(300)
async def test_a_memory_alarm_blocks_reports_which_are_held_then_published(
    node_310: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    broker = node_310
    assert broker.node is not None
    case = Case(broker, "alarm", markers, tmp_path)
    case.worker.start()
    ids, release = await publish_held(case, 12)
    broker.node.set_memory_alarm(True)
    release.touch()  # the reports of the tasks in flight meet the alarm
    alarmed = time.monotonic()
    body: dict[str, Any]
    status, body = 200, {}  # what /ready said last
    while time.monotonic() - alarmed < OUTAGE_S:
        status, body = ready_status(case.worker.probes)
        if status == 503:
            break
        await asyncio.sleep(0.5)  # readiness sampled over HTTP until it says 503
    await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - alarmed)))  # the outage's rest
    broker.node.set_memory_alarm(False)
    counts = await case.settle(ids, timeout_s=60)
    record(
        counts.row(
            "memory alarm for 15 s, then cleared",
            broker=broker.label,
            measured=f"/ready {status} ({', '.join(body.get('components', {}))}) during the alarm",
        )
    )
    assert status == 503, body
    assert "broker" in json.dumps(body)
    counts.assert_intact()
    assert counts.codes == {"success": 12}
    assert all(attempts == [1] for attempts in counts.attempts.values())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("node", SIZE_LIMITED, indirect=True)
async def test_a_report_over_the_brokers_size_limit_is_one_result_too_large(
    node: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    case = Case(node, "big", markers, tmp_path)
    case.worker.start()
    ids = await case.publish(3, {"size": 2_000_000})
    counts = await case.settle(ids, timeout_s=60)
    record(
        counts.row(
            "a 2 MB result, broker max_message_size 1 MiB",
            broker=node.label,
            measured="one RESULT_TOO_LARGE each, handler run once",
        )
    )
    counts.assert_intact()
    assert counts.codes == {"RESULT_TOO_LARGE": 3}
    assert counts.handler_runs == 3
    log = case.worker.log()
    assert "channel closed 5 times" not in log
    assert_reports_connection_kept(log)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("node", SIZE_LIMITED, indirect=True)
async def test_reports_too_large_among_others_at_concurrency_32_cost_no_other_task(
    node: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    # Each oversized report closes the reports' channel, losing what was unconfirmed on it:
    # other tasks' ``started`` sent behind it. Their terminal reports must carry them again,
    # and the oversized ones still end as RESULT_TOO_LARGE, each handler run once.
    env = {"WORKER_CONCURRENCY": "32"}
    case = Case(node, "bigmix", markers, tmp_path, target="tests.faults.workers:quick", env=env)
    case.worker.start()
    big = await case.publish(6, {"size": 2_000_000}, service="quick")
    small = await case.publish(18, {"size": 10}, service="quick")
    counts = await case.settle(big + small, timeout_s=90)
    record(
        counts.row(
            "2 MB results among small ones at concurrency 32, max_message_size 1 MiB",
            broker=node.label,
            measured="RESULT_TOO_LARGE 6, success 18, each handler run once",
        )
    )
    counts.assert_intact()
    assert counts.codes == {"RESULT_TOO_LARGE": 6, "success": 18}
    assert counts.handler_runs == 24
    log = case.worker.log()
    assert "without started" not in log
    assert_reports_connection_kept(log)


def assert_reports_connection_kept(log: str) -> None:
    """The reports' connection never closed: a refused report cost its channel only (no
    frame went out on the closed channel, which RabbitMQ 4.0 answers by closing the
    connection: ``504 CHANNEL_ERROR - expected 'channel.open'``)."""
    assert "CHANNEL_ERROR" not in log
    assert "worker reports) closed" not in log
    assert "Reconnected to" not in log


CONSUMER_TIMEOUT = {
    "conf": {"consumer_timeout": "20000"},
    "advanced_config": "[{rabbit, [{channel_tick_interval, 1000}]}].",
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("node_310", [CONSUMER_TIMEOUT], indirect=True)
async def test_a_report_held_past_the_consumer_timeout_is_given_back_in_time(
    node_310: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    broker = node_310
    env = {
        "WORKER_CONSUMER_TIMEOUT_S": "20",
        "WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S": "2",
        "WORKER_RETRY_BACKOFF_MAX_S": "1",
        "WORKER_TASK_TIMEOUT_S": "5",
        "WORKER_DELIVERY_LIMIT": "5",
    }
    case = Case(broker, "held", markers, tmp_path, env=env)
    case.worker.start()
    await fill_output_queue(broker, case.vhost, case.out_queue)
    ids = await case.publish(4, {"seconds": 0.2})
    case.worker.wait_for("reason=report_held_until_consumer_timeout", timeout_s=60, count=4)
    broker.ctl("clear_policy", "-p", case.vhost, "full")
    counts = await case.settle(ids, timeout_s=60)
    log = case.worker.log()
    gave_back = decisions(log, lambda r: r.get("outcome") == "publish_failed")
    record(
        counts.row(
            "output queue full past the consumer timeout (20 s)",
            broker=broker.label,
            measured=f"{len(gave_back)} give-backs at the hold's end, no consumer timeout",
        )
    )
    counts.assert_intact()
    assert counts.codes == {"success": 4}
    assert all(r["reason"] == "report_held_until_consumer_timeout" for r in gave_back)
    assert "delivery acknowledgement on channel" not in log  # the broker never timed one out
    assert "The consume channel closed" not in log


@pytest.mark.timeout(300)
async def test_the_reports_connection_closed_during_an_alarm_comes_back(
    node_310: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    broker = node_310
    assert broker.node is not None
    case = Case(broker, "alarmclose", markers, tmp_path)
    case.worker.start()
    ids, release = await publish_held(case, 12)
    broker.node.set_memory_alarm(True)
    release.touch()
    case.worker.wait_for("was blocked by")
    # The broker closes the blocked reports connection; it stops reading that socket, so the
    # closing handshake can never finish.
    connections = broker.ctl("list_connections", "-q", "pid", "vhost", "client_properties")
    for line in connections.splitlines():
        if case.vhost in line and "worker reports" in line:
            broker.ctl("close_connection", line.split()[0], "fault suite")
    await asyncio.sleep(5.0)  # the alarm holds 5 s past the close, then clears
    broker.node.set_memory_alarm(False)
    cleared = time.monotonic()
    counts = await case.settle(ids, timeout_s=90)
    last = max(at for at, _, kind in case.ledger.arrivals if kind in ("success", "failure"))
    record(
        counts.row(
            "memory alarm, and the blocked reports connection closed by the broker",
            broker=broker.label,
            measured=f"all reported {last - cleared:.1f} s after the alarm cleared",
        )
    )
    counts.assert_intact()
    assert counts.codes == {"success": 12}
