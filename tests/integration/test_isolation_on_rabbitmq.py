"""A process-isolated task on the real broker: SIGTERM past the grace kills its whole group."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.runtime.hooks import shutdown_bound_s
from async_task_api_worker.settings import load_settings
from tests.integration.conftest import Queues, wait_for
from tests.unit.process.test_process_executor import processes_with

TARGET = "tests.unit.process.workers:isolated"


def test_sigterm_past_the_grace_kills_the_group_and_gives_the_input_back(
    queues: Queues, start_worker: Any, tmp_path: Path
) -> None:
    grace_s = 1.0
    worker = start_worker(TARGET, queues.env(WORKER_SHUTDOWN_GRACE_S=str(grace_s)))
    marker = f"atw-drain-{uuid.uuid4().hex}"
    pid_file = tmp_path / "child.pid"

    async def submit() -> str:
        async with queues.client("isolated") as client:
            return await client.submit(
                {"mode": "grandchildren", "marker": marker, "data": str(pid_file)}
            )

    task_id = asyncio.run(submit())
    wait_for(lambda: len(processes_with(marker)) == 2, what="the task's two grandchildren")
    signalled_at = time.monotonic()
    worker.signal(signal.SIGTERM)
    bound_s = shutdown_bound_s(
        load_settings({"worker_shutdown_grace_s": grace_s}, read_environment=False)
    )
    assert worker.wait(timeout_s=bound_s) == 0
    assert time.monotonic() - signalled_at < bound_s
    with pytest.raises(ProcessLookupError):
        os.killpg(int(pid_file.read_text()), 0)
    assert processes_with(marker) == []
    assert "outcome=shutdown_requeued action=nack-requeue" in worker.log()
    assert task_id in worker.log()
    queues.assert_counts(queues.in_queue, (1, 0))  # given back, waiting for the next worker


def test_a_task_still_running_in_the_drain_keeps_its_lease(
    queues: Queues, start_worker: Any, tmp_path: Path
) -> None:
    # A lease of 2 s (two heartbeats of 1 s), a task of 5 s begun before SIGTERM: the worker no
    # longer consumes, but still holds its deliveries, and renews.
    env = queues.env(BROKER_HEARTBEAT_S="1", WORKER_SHUTDOWN_GRACE_S="30")
    worker = start_worker(TARGET, env)
    started = tmp_path / "started"

    async def submit() -> list[str]:
        async with queues.client("isolated") as client:
            task_id = await client.submit({"mode": "sleep", "data": 5, "marker": str(started)})
            await asyncio.to_thread(wait_for, started.exists, 30, "the task to start")
            worker.signal(signal.SIGTERM)
            return [report.type async for report in client.reports(task_id)]

    assert asyncio.run(submit()) == ["started", "success"]
    assert worker.wait(timeout_s=60) == 0
    assert "lease_lapsed" not in worker.log()


def _children_of(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                children.append(int(entry.name))
    return children


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_the_fork_server_ends_quietly_when_its_worker_is_killed(
    queues: Queues, start_worker: Any, tmp_path: Path
) -> None:
    worker = start_worker(TARGET, queues.env())
    started = tmp_path / "started"

    async def submit() -> str:
        async with queues.client("isolated") as client:
            return await client.submit({"mode": "sleep", "data": 1.0, "marker": str(started)})

    asyncio.run(submit())
    wait_for(lambda: len(_children_of(worker.pid)) == 1, what="the fork server")
    fork_server = _children_of(worker.pid)[0]
    # Not only forked: the task's process has read its request, which the worker sends after
    # the fork (a worker stopped before that would leave the process waiting for it).
    wait_for(started.exists, what="the task's start")
    task = _children_of(fork_server)[0]
    # The worst moment: the task ends while the worker is stopped, so the fork server's news
    # of it is never read, and the worker's end of their socket is reset rather than closed.
    worker.signal(signal.SIGSTOP)
    wait_for(lambda: _gone(task), what="the task's end")
    worker.signal(signal.SIGKILL)
    worker.wait()
    wait_for(lambda: _gone(fork_server), what="the fork server's end")
    assert "Traceback" not in worker.log()
