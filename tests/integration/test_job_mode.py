"""WORKER_MODE=job on real processes: a quota per run, exit codes that report the pod."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from tests.integration.conftest import Queues
from tests.integration.test_run_on_rabbitmq import calls, collect


def job_env(queues: Queues, markers: Path, idle_s: str = "60", **overrides: str) -> dict[str, str]:
    """A job's environment. Its idle wait starts before ``basic.consume``, which a loaded node's
    quorum queue can take seconds to answer: only the test of that wait makes it short."""
    return queues.env(
        WORKER_MODE="job",
        WORKER_CONCURRENCY="4",  # job mode forces the prefetch to 1 anyway
        WORKER_JOB_IDLE_TIMEOUT_S=idle_s,
        ATW_TEST_MARKERS=str(markers),
        **overrides,
    )


async def test_five_job_runs_with_a_quota_of_one_process_five_tasks_at_their_first_attempt(
    queues: Queues, markers: Path, start_worker: Any
) -> None:
    async with queues.client("sleeping") as client:
        task_ids = [await client.submit({"seconds": 0.2}) for _ in range(5)]
        for _ in range(5):
            job = start_worker(
                "tests.integration.workers:sleeping", job_env(queues, markers), wait_connected=False
            )
            assert job.wait(timeout_s=60) == 0, job.log()
            assert job.log().count("Delivery settled:") == 1
        for task_id in task_ids:
            assert (await collect(client, task_id))[-1].type == "success"
    # No message was ever held by a job that did not run it: each handler saw attempt 1.
    assert sorted(attempt for task_id in task_ids for attempt in calls(markers, task_id)) == [1] * 5
    queues.assert_drained(queues.in_queue)


def test_an_empty_queue_ends_the_job_with_0_after_the_idle_wait(
    queues: Queues, markers: Path, start_worker: Any
) -> None:
    started = time.monotonic()
    job = start_worker(
        "examples.count_words:worker", job_env(queues, markers, idle_s="2"), wait_connected=False
    )
    assert job.wait(timeout_s=60) == 0, job.log()
    assert time.monotonic() - started >= 2.0  # it waited its WORKER_JOB_IDLE_TIMEOUT_S
    assert "No delivery for 2 s: the job ends" in job.log()


def test_an_unreachable_broker_ends_the_job_with_1_after_the_connect_timeout(
    queues: Queues, markers: Path, start_worker: Any
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = job_env(
        queues,
        markers,
        BROKER_URL=f"amqp://guest:guest@127.0.0.1:{port}/",
        WORKER_JOB_CONNECT_TIMEOUT_S="2",
    )
    job = start_worker("examples.count_words:worker", env, wait_connected=False)
    assert job.wait(timeout_s=60) == 1, job.log()
    assert "was not reachable within 2 s" in job.log()


async def test_a_failing_task_still_ends_the_job_with_0(
    queues: Queues, markers: Path, start_worker: Any
) -> None:
    async with queues.client("count-words") as client:
        task_id = await client.submit({"text": "  "})
        job = start_worker(
            "examples.count_words:worker", job_env(queues, markers), wait_connected=False
        )
        assert job.wait(timeout_s=60) == 0, job.log()
        assert (await collect(client, task_id))[-1].type == "failure"
