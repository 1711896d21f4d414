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
