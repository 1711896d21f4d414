"""SIGTERM on a real worker process: the shutdown ends within the bound its settings give."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from async_task_api_worker.client import TaskClient
from async_task_api_worker.runtime.hooks import shutdown_bound_s
from async_task_api_worker.settings import load_settings
from tests.integration.conftest import Queues, wait_for
from tests.integration.test_run_on_rabbitmq import calls


async def test_a_def_handler_stuck_past_the_drain_exits_1_within_the_bound(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    overrides = {"WORKER_SHUTDOWN_GRACE_S": "1"}
    env = queues.env(ATW_TEST_MARKERS=str(markers), **overrides)
    worker = start_worker("tests.integration.workers:stuck", env)
    async with TaskClient(
        url=queues.url, service="stuck", in_queue=queues.in_queue, out_queue=queues.out_queue
    ) as client:
        task_id = await client.submit({})
    wait_for(lambda: calls(markers, task_id) == [1], what="the handler to start")
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    code = worker.wait(timeout_s=120)
    elapsed = time.monotonic() - signalled
    bound = shutdown_bound_s(load_settings({"worker_shutdown_grace_s": 1}, read_environment=False))
    assert code == 1
    assert elapsed < bound, f"{elapsed:.1f} s, bound {bound} s"
    assert f"The handler of task {task_id} is still running after the drain" in worker.log()
    queues.assert_counts(queues.in_queue, (1, 0))  # given back, not lost, no failure report
