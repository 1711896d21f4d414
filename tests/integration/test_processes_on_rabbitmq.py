"""``run --processes 2`` on the real broker: both processes consume, /ready and /metrics are the
pod's, a killed process comes back without losing a task, and the stop keeps its bound."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from async_task_api_worker.cli.loading import load_worker
from async_task_api_worker.client import AnyReport, TaskClient
from async_task_api_worker.runtime.entry import shutdown_bounds
from async_task_api_worker.runtime.processes import shutdown_bound_of
from async_task_api_worker.settings import load_settings
from tests.integration.conftest import Queues, broker_url, wait_for
from tests.integration.test_run_on_rabbitmq import reading
from tests.polling import until
from tests.probes_client import get

TWO = ("--processes", "2")
SLEEPING = "tests.integration.workers:sleeping"


def bound_of(target: str, **values: object) -> float:
    """The bound ``run --processes 2`` keeps with these settings, as ``check`` computes it."""
    settings = load_settings({"worker_processes": 2, **values}, read_environment=False)
    _, process_bound_s = shutdown_bounds(load_worker(target), settings)
    return shutdown_bound_of(2, process_bound_s)


def lines(worker: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in worker.stdout().splitlines() if line.startswith("{")]


def started_pids(worker: Any) -> dict[str, list[int]]:
    """The pids each ``process-<n>`` had, in order, from the supervisor's lines."""
    pids: dict[str, list[int]] = {}
    for line in lines(worker):
        if line["msg"].startswith("Worker process-") and line["msg"].split()[2] == "started":
            pids.setdefault(line["msg"].split()[1], []).append(line["pid"])
    return pids


def wait_ready(worker: Any, timeout_s: float = 30.0) -> str:
    """Wait until both processes are connected and the supervisor's /ready answers 200."""
    wait_for(lambda: worker.log().count("Connected to") >= 2, timeout_s, "two connections")
    url = worker.probes_url  # the supervisor's: its line comes before the processes start
    wait_for(lambda: get(url, "/ready").status == 200, timeout_s, "the supervisor ready")
    return url


def metric(url: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(get(url, "/metrics").body.decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    raise LookupError(name)


def pids_of(markers: Path, task_id: str) -> list[int]:
    """The pids that ran ``task_id`` (``workers._mark``: ``<task_id>.<attempt>.<pid>``)."""
    return [int(path.name.split(".")[2]) for path in sorted(markers.glob(f"{task_id}.*"))]


async def all_reports(client: TaskClient, task_ids: list[str]) -> dict[str, list[AnyReport]]:
    async def one(task_id: str) -> list[AnyReport]:
        return [report async for report in client.reports(task_id)]

    gathered = await asyncio.wait_for(asyncio.gather(*(one(t) for t in task_ids)), timeout=90)
    return dict(zip(task_ids, gathered, strict=True))


async def test_both_processes_take_tasks_and_metrics_add_them_up(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    worker = start_worker(
        SLEEPING, queues.env(ATW_TEST_MARKERS=str(markers)), wait_connected=False, args=TWO
    )
    url = wait_ready(worker)
    async with queues.client("sleeping") as client:
        task_ids = [await client.submit({"seconds": 0.3}) for _ in range(8)]
        reports = await all_reports(client, task_ids)
    assert all([r.type for r in rs] == ["started", "success"] for rs in reports.values())
    ran_in = {pid for task_id in task_ids for pid in pids_of(markers, task_id)}
    assert ran_in == {pids[0] for pids in started_pids(worker).values()}
    assert len(ran_in) == 2
    wait_for(
        lambda: metric(url, "worker_tasks_total", status="success") == 8,
        what="8 successes on /metrics",
    )
    assert metric(url, "worker_messages_published_total", message_type="success") == 8
    assert metric(url, "worker_tasks_in_flight") == 0
    decisions = [line for line in lines(worker) if line["msg"].startswith("Delivery settled")]
    assert sorted(line["task_id"] for line in decisions) == sorted(task_ids)
    assert {line["worker_process"] for line in decisions} == {1, 2}
    queues.assert_drained(queues.in_queue)


def test_ready_only_while_every_process_is_ready(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    worker = start_worker(
        "tests.integration.workers:pooled",
        queues.env(ATW_TEST_MARKERS=str(markers)),
        wait_connected=False,
        args=TWO,
    )
    url = wait_ready(worker)
    second = started_pids(worker)["process-2"][0]
    (markers / f"down-{second}").touch()  # this process's own readiness probe fails
    answer = get(url, "/ready")
    assert answer.status == 503
    assert answer.json()["components"] == {"process-2": "database (returned false)"}
    assert get(url, "/health").status == 200
    (markers / f"down-{second}").unlink()
    assert get(url, "/ready").status == 200


async def test_a_killed_process_comes_back_and_no_task_is_lost(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    worker = start_worker(
        SLEEPING, queues.env(ATW_TEST_MARKERS=str(markers)), wait_connected=False, args=TWO
    )
    url = wait_ready(worker)
    async with queues.client("sleeping") as client:
        held = await client.submit({"seconds": 3600})  # only its first attempt sleeps
        held_reports, read = reading(client, held)
        # Its ``started`` report too: it is published beside the handler, so a kill right after
        # the call began (a loaded machine) could come before it left.
        await until(
            lambda: len(pids_of(markers, held)) == 1 and len(held_reports) == 1,
            what="the long task to start, and its started report",
        )
        (victim,) = pids_of(markers, held)
        name = next(n for n, pids in started_pids(worker).items() if pids[-1] == victim)
        others = [await client.submit({"seconds": 0.2}) for _ in range(6)]
        os.kill(victim, signal.SIGKILL)
        worker.wait_for_log("ended unexpectedly (killed by SIGKILL)")
        wait_for(lambda: len(started_pids(worker)[name]) == 2, what=f"{name} started again")
        reports = await all_reports(client, others)
        await asyncio.wait_for(read, timeout=90)
    assert [(r.type, r.attempt) for r in held_reports] == [
        ("started", 1),
        ("started", 2),
        ("success", 2),
    ]
    for task_id in others:
        assert [r.type for r in reports[task_id]][-1] == "success"
    wait_for(lambda: get(url, "/ready").status == 200, what="ready again")

    def successes(task_id: str) -> int:
        return sum(
            task_id in line and "outcome=success" in line for line in worker.log().splitlines()
        )

    # A decision line follows the settle, after the report the client already has: under load
    # a moment later.
    wait_for(lambda: all(successes(t) for t in [held, *others]), what="every decision line")
    for task_id in [held, *others]:  # exactly one terminal decision per task
        assert successes(task_id) == 1
    queues.assert_drained(queues.in_queue)
    queues.assert_drained(queues.out_queue)  # nothing more was reported for any of them


async def test_sigterm_drains_both_processes_and_exits_0_within_the_bound(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    env = queues.env(ATW_TEST_MARKERS=str(markers), WORKER_SHUTDOWN_GRACE_S="10")
    worker = start_worker(SLEEPING, env, wait_connected=False, args=TWO)
    wait_ready(worker)
    async with queues.client("sleeping") as client:
        task_ids = [await client.submit({"seconds": 3}) for _ in range(2)]
        wait_for(lambda: all(pids_of(markers, t) for t in task_ids), what="both tasks to start")
        assert len({pids_of(markers, t)[0] for t in task_ids}) == 2  # one in each process
        signalled = time.monotonic()
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout_s=120) == 0
        elapsed = time.monotonic() - signalled
        reports = await all_reports(client, task_ids)
    bound = bound_of(SLEEPING, worker_shutdown_grace_s=10)
    assert elapsed < bound, f"{elapsed:.1f} s, bound {bound} s"
    assert all([r.type for r in rs] == ["started", "success"] for rs in reports.values())
    assert worker.log().count("Shutdown requested (SIGTERM): draining") == 2
    assert "Worker processes stopped (exit code 0)" in worker.log()


def test_a_process_past_the_bound_is_killed_and_run_exits_1(
    queues: Queues, start_worker: Any
) -> None:
    target = "tests.integration.workers:blocking_stop"
    env = queues.env(WORKER_SHUTDOWN_GRACE_S="0", WORKER_SHUTDOWN_HOOKS_TIMEOUT_S="1")
    worker = start_worker(target, env, wait_connected=False, args=TWO)
    wait_ready(worker)
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout_s=120) == 1
    elapsed = time.monotonic() - signalled
    bound = bound_of(target, worker_shutdown_grace_s=0, worker_shutdown_hooks_timeout_s=1)
    assert elapsed < bound, f"{elapsed:.1f} s, bound {bound} s"
    assert worker.log().count("killing its process group") == 2
    assert "Worker processes stopped (exit code 1)" in worker.log()


def test_refused_credentials_in_the_processes_exit_2(queues: Queues, start_worker: Any) -> None:
    env = queues.env(BROKER_URL=broker_url(queues.vhost, password="wrong"))
    worker = start_worker(SLEEPING, env, wait_connected=False, args=TWO)
    assert worker.wait(timeout_s=60) == 2
    assert "exited 2 (a configuration error)" in worker.log()
    assert "Worker processes stopped (exit code 2)" in worker.log()
    assert "wrong" not in worker.log()
