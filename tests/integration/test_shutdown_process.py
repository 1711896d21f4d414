"""SIGTERM on a real worker process: the shutdown ends within the bound its settings give."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.client import TaskClient
from async_task_api_worker.runtime.hooks import shutdown_bound_s
from async_task_api_worker.runtime.signals import ECHO_WINDOW_S
from async_task_api_worker.settings import load_settings
from tests.integration.conftest import REPO, Queues, wait_for
from tests.integration.test_run_on_rabbitmq import calls


async def test_a_def_handler_stuck_past_the_drain_exits_1_within_the_bound(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    overrides = {"WORKER_SHUTDOWN_GRACE_S": "1"}
    env = queues.env(ATW_TEST_MARKERS=str(markers), **overrides)
    worker = start_worker("tests.integration.workers:stuck", env)
    async with queues.client("stuck") as client:
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


COUNTING = "tests.integration.counting_workers:counting"


def bound_for(grace_s: float) -> float:
    return shutdown_bound_s(
        load_settings({"worker_shutdown_grace_s": grace_s}, read_environment=False)
    )


async def test_sigterm_lets_a_running_task_finish_and_exits_0(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    worker = start_worker(
        "tests.integration.observed_workers:observed",
        queues.env(ATW_TEST_MARKERS=str(markers), WORKER_SHUTDOWN_GRACE_S="10"),
    )
    async with queues.client("observed") as client:
        task_id = await client.submit({"mode": "wait"})
        wait_for((markers / f"started-{task_id}").exists, what="the handler to start")
        signalled = time.monotonic()
        worker.signal(signal.SIGTERM)
        # The task ends once the drain waits for it (a task of fixed seconds could end before
        # the signal on a loaded machine, or outlast the grace), well inside the grace.
        worker.wait_for_log("Waiting up to")
        (markers / "release").touch()
        assert worker.wait(timeout_s=120) == 0
        assert time.monotonic() - signalled < bound_for(10)
        reports = [r async for r in client.reports(task_id)]
    assert [r.type for r in reports] == ["started", "success"]
    assert worker.log().count("outcome=success action=ack") == 1
    queues.assert_drained(queues.in_queue)  # acked once: nobody will receive it again


async def test_a_task_longer_than_the_grace_is_given_back_without_a_report(
    queues: Queues, start_worker: Any, markers: Path, rabbitmq_version: tuple[int, ...]
) -> None:
    env = queues.env(ATW_TEST_MARKERS=str(markers), WORKER_SHUTDOWN_GRACE_S="1")
    # Only the first call sleeps (a marker file says which: on 4.3 the attempt stays 1).
    worker = start_worker(COUNTING, env)
    async with queues.client("counting") as client:
        task_id = await client.submit({"first": "sleep"})
        wait_for((markers / f"{task_id}.first").exists, what="the handler to start")
        signalled = time.monotonic()
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout_s=120) == 0
        assert time.monotonic() - signalled < bound_for(1)
        assert "outcome=shutdown_requeued action=nack-requeue" in worker.log()
        queues.assert_counts(queues.in_queue, (1, 0))
        second = start_worker(COUNTING, env)
        reports = [r async for r in client.reports(task_id)]
    assert [r.type for r in reports] == ["started", "started", "success"]  # no failure report
    # RabbitMQ 3.10 (and 4.0) counts the give-back (basic.nack) as a delivery: the next attempt
    # is 2. From 4.3 only basic.reject counts, and the same test sees attempt 1 again.
    attempt = 2 if rabbitmq_version < (4, 3) else 1
    assert reports[-1].attempt == attempt
    assert f"attempt={attempt}/5" in second.log()


async def test_a_second_sigterm_ends_the_drain_at_once(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    env = queues.env(ATW_TEST_MARKERS=str(markers), WORKER_SHUTDOWN_GRACE_S="600")
    worker = start_worker("tests.integration.workers:sleeping", env)
    async with queues.client("sleeping") as client:
        task_id = await client.submit({"seconds": 3600})
        wait_for(lambda: calls(markers, task_id) == [1], what="the handler to start")
        worker.signal(signal.SIGTERM)
        # The worker counts the first signal when its loop takes it, which a loaded machine
        # delays past the send; it logs this line after. A deliberate second signal comes
        # later than an echo of the first could: the window counted from the line, not the send.
        worker.wait_for_log("Waiting up to")
        time.sleep(ECHO_WINDOW_S + 0.1)
        signalled = time.monotonic()
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout_s=120) == 0
        assert time.monotonic() - signalled < bound_for(0)  # the grace no longer counts
    assert "Second shutdown request" in worker.log()
    queues.assert_counts(queues.in_queue, (1, 0))


def test_a_signal_during_a_slow_startup_hook_exits_0_at_once(
    queues: Queues, start_worker: Any
) -> None:
    worker = start_worker(
        "tests.integration.workers:slow_start", queues.env(), wait_connected=False
    )
    worker.wait_for_log("Running 1 startup hook(s)")  # inside its hour-long hook now
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout_s=60) == 0
    assert time.monotonic() - signalled < bound_for(25)
    assert "Connected to" not in worker.log()


def test_a_failing_startup_hook_exits_1_with_one_line(queues: Queues, start_worker: Any) -> None:
    worker = start_worker(
        "tests.integration.workers:failing_start", queues.env(), wait_connected=False
    )
    assert worker.wait(timeout_s=60) == 1
    lines = [line for line in worker.log().splitlines() if "did not start" in line]
    assert len(lines) == 1
    assert "cannot_load raised FileNotFoundError" in lines[0]


async def test_a_to_thread_thread_stuck_past_the_drain_exits_1_within_the_bound(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    env = queues.env(ATW_TEST_MARKERS=str(markers), WORKER_SHUTDOWN_GRACE_S="1")
    worker = start_worker("tests.integration.workers:offloading", env)
    async with queues.client("offloading") as client:
        task_id = await client.submit({})
    wait_for(lambda: calls(markers, task_id) == [1], what="the handler to start")
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout_s=120) == 1
    assert time.monotonic() - signalled < bound_for(1)
    assert f"started by the handler of task {task_id} (asyncio.to_thread)" in worker.log()


class UnderUv:
    """``uv run async-task-api-worker run TARGET`` in a session of its own, as a terminal runs
    it: Ctrl-C is SIGINT to the whole process group (uv and the worker), and uv forwards it."""

    def __init__(self, target: str, env: dict[str, str], logs: Path) -> None:
        uv = shutil.which("uv")
        if uv is None:
            pytest.skip("uv is not on PATH")
        self.log_path = logs / f"uv-{uuid.uuid4().hex[:6]}.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [uv, "run", "--no-sync", "async-task-api-worker", "run", target],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text()

    def ctrl_c(self) -> None:
        os.killpg(self.process.pid, signal.SIGINT)

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._log.close()


@contextlib.asynccontextmanager
async def waiting_task_under_uv(
    queues: Queues, markers: Path, logs: Path, *, grace_s: int
) -> AsyncIterator[tuple[UnderUv, TaskClient, str]]:
    """The ``observed`` worker under ``uv run``, with one task running until the test releases
    it (``release`` in ``markers``)."""
    env = queues.env(ATW_TEST_MARKERS=str(markers), WORKER_SHUTDOWN_GRACE_S=str(grace_s))
    worker = UnderUv("tests.integration.observed_workers:observed", env, logs)
    try:
        wait_for(lambda: "Connected to" in worker.log(), what="the worker to connect")
        async with queues.client("observed") as client:
            task_id = await client.submit({"mode": "wait"})
            wait_for((markers / f"started-{task_id}").exists, what="the handler to start")
            yield worker, client, task_id
    finally:
        worker.close()


#: The worker's line for uv's forwarded copy of a Ctrl-C, taken for the same request.
ECHO_LINE = "SIGINT again "


def logged(worker: UnderUv, text: str) -> bool:
    """Whether ``text`` is in the worker's log (AssertionError: it exited without it)."""
    if text not in worker.log() and worker.process.poll() is not None:
        raise AssertionError(f"the worker exited without {text!r}:\n{worker.log()}")
    return text in worker.log()


async def test_ctrl_c_under_uv_run_lets_the_task_finish_and_exits_0(
    queues: Queues, markers: Path, tmp_path: Path
) -> None:
    running = waiting_task_under_uv(queues, markers, tmp_path, grace_s=60)
    async with running as (worker, client, task_id):
        worker.ctrl_c()
        # The task ends once uv's copy of the Ctrl-C came and the worker took it for the same
        # request: a task of fixed seconds could end before the Ctrl-C or before uv's copy (it
        # came 200 ms after on a quiet machine) on a loaded one, and leave the echo untested.
        wait_for(lambda: logged(worker, "Waiting up to"), what="the drain to start")
        wait_for(lambda: logged(worker, ECHO_LINE), what="uv's copy of the Ctrl-C")
        (markers / "release").touch()
        assert worker.process.wait(timeout=120) == 0
        reports = [r async for r in client.reports(task_id)]
    assert [r.type for r in reports] == ["started", "success"]  # finished, not given back
    assert "Second shutdown request" not in worker.log()
    queues.assert_drained(queues.in_queue)


async def test_two_deliberate_ctrl_c_under_uv_run_end_the_grace_period(
    queues: Queues, markers: Path, tmp_path: Path
) -> None:
    running = waiting_task_under_uv(queues, markers, tmp_path, grace_s=600)
    async with running as (worker, _, _):
        worker.ctrl_c()
        wait_for(lambda: logged(worker, "Waiting up to"), what="the drain to start")
        wait_for(lambda: logged(worker, ECHO_LINE), what="uv's copy of the first Ctrl-C")
        time.sleep(1.0)  # a person's second Ctrl-C, a second later (after the echo window)
        signalled = time.monotonic()
        worker.ctrl_c()
        assert worker.process.wait(timeout=120) == 0
        assert time.monotonic() - signalled < bound_for(0)  # the grace no longer counts
    assert "Second shutdown request" in worker.log()
    queues.assert_counts(queues.in_queue, (1, 0))  # given back for another worker
