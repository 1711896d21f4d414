"""Fencing (issue 30): a task's process group holds a lease its worker renews.

The group stops itself, whole, once renewals stop; a renewed one runs on; and the worker
reports nothing a run whose lease lapsed concluded: it gives the delivery back.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from async_task_api_worker.broker_rules import lease_expiry_s
from async_task_api_worker.executors.process.lease import RENEWAL
from async_task_api_worker.ports import Action, DeliverySettled, EngineEvent, Outcome, Settlement
from async_task_api_worker.runtime import Runner
from async_task_api_worker.settings import load_settings
from async_task_api_worker.transports.memory import InMemoryTransport
from tests.polling import until, wait_for
from tests.unit.process.test_process_executor import processes_with, task_body
from tests.unit.process.workers import isolated

REPO = Path(__file__).resolve().parents[3]

FENCED = """
import os, subprocess, sys, time
from async_task_api_worker.executors.process.lease import fence
fence(int(sys.argv[1]), float(sys.argv[2]))
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", os.environ["MARKER"]])
print("fenced", flush=True)
time.sleep(300)
"""


def start_fenced(expiry_s: float, marker: str) -> tuple[subprocess.Popen[bytes], int]:
    """A group leader holding a lease of ``expiry_s`` on a pipe, with a grandchild tagged by
    ``marker``; the write end of the pipe (the worker's)."""
    read_end, write_end = os.pipe()
    process = subprocess.Popen(
        [sys.executable, "-c", FENCED, str(read_end), str(expiry_s)],
        env={**os.environ, "MARKER": marker},  # on the grandchild's command line alone
        pass_fds=(read_end,),
        start_new_session=True,
        stdout=subprocess.PIPE,
        cwd=REPO,
    )
    os.close(read_end)
    assert process.stdout is not None
    assert process.stdout.readline() == b"fenced\n"  # the watchdog runs, the grandchild too
    return process, write_end


def stop(process: subprocess.Popen[bytes]) -> None:
    """Kill what is left of the group, and close its pipe."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert process.stdout is not None
    process.stdout.close()


def gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_renewed_group_runs_on_and_one_not_renewed_stops_whole() -> None:
    expiry_s = 0.5
    marker = f"atw-lease-{uuid.uuid4().hex}"
    process, renewals = start_fenced(expiry_s, marker)
    try:
        for _ in range(16):  # four expiries, renewed four times in each
            os.write(renewals, RENEWAL)
            time.sleep(expiry_s / 4)
        assert process.poll() is None
        assert len(processes_with(marker)) == 1
        # No renewal from here on: the watchdog kills the group, grandchild and all.
        wait_for(lambda: process.poll() is not None, 30, "the group to stop itself")
        assert process.returncode == -signal.SIGKILL
        wait_for(lambda: gone(process.pid), 10, "the group's last process to go")
        assert processes_with(marker) == []
    finally:
        os.close(renewals)
        stop(process)


def test_a_group_whose_worker_is_gone_stops_at_once() -> None:
    marker = f"atw-lease-{uuid.uuid4().hex}"
    process, renewals = start_fenced(3600.0, marker)
    try:
        os.close(renewals)  # what the worker's death does to its end
        wait_for(lambda: process.poll() is not None, 30, "the group to stop itself")
        assert process.returncode == -signal.SIGKILL
        wait_for(lambda: not processes_with(marker), 10, "the grandchild to go")
    finally:
        stop(process)


class Settlements:
    """An observer of the engine: each settlement, and an event per settlement."""

    def __init__(self) -> None:
        self.settlements: list[Settlement] = []
        self.settled = asyncio.Event()

    def notify(self, event: EngineEvent) -> None:
        if isinstance(event, DeliverySettled):
            self.settlements.append(event.settlement)
            self.settled.set()


class Unheld(InMemoryTransport):
    """An in-memory broker whose worker can be told it does not hold its deliveries."""

    def __init__(self) -> None:
        super().__init__()
        self.held = True

    @property
    def holding(self) -> bool:
        return self.held


def two_second_lease(transport: InMemoryTransport) -> tuple[Settlements, Runner]:
    """A runner of ``isolated`` on ``transport``, its lease expiring after 2 s (heartbeat 1 s)."""
    settings = load_settings({"broker_heartbeat_s": 1}, read_environment=False)
    assert lease_expiry_s(settings) == 2.0
    observed = Settlements()
    return observed, Runner(isolated, settings, transport, observers=[observed])


def assert_fenced_then_run_again(transport: InMemoryTransport, observed: Settlements) -> None:
    """The fenced run reported nothing (no ``WORKER_CRASHED``) and was given back uncounted;
    the next run reported the one terminal report."""
    assert [p.report.type for p in transport.published] == ["started", "started", "success"]
    fenced, ran = observed.settlements
    assert (fenced.outcome, fenced.action, fenced.code) == (
        Outcome.CANCELLED,
        Action.NACK_REQUEUE,
        None,
    )
    assert (fenced.reason, fenced.requeue_counted) == ("lease_lapsed", False)
    assert ran.outcome is Outcome.SUCCESS


async def test_a_frozen_worker_reports_nothing_for_its_fenced_task(tmp_path: Path) -> None:
    first_run = tmp_path / "first-run"
    transport = InMemoryTransport()
    observed, runner = two_second_lease(transport)
    serving = asyncio.create_task(runner.serve())
    try:
        body = {"mode": "once", "marker": str(first_run), "data": 60}
        transport.put(task_body("t-frozen", body))
        await until(first_run.exists, 30, "the first run")
        # The worker's event loop is frozen from here until the task's group has stopped
        # itself: no renewal goes out meanwhile, as under SIGSTOP.
        wait_for(lambda: gone(int(first_run.read_text())), 30, "the group to stop itself")
        await transport.join()
    finally:
        runner.request_shutdown("test")
        await serving
    assert_fenced_then_run_again(transport, observed)


async def test_a_worker_that_does_not_hold_its_deliveries_stops_renewing(
    tmp_path: Path,
) -> None:
    first_run = tmp_path / "first-run"
    transport = Unheld()
    observed, runner = two_second_lease(transport)
    serving = asyncio.create_task(runner.serve())
    try:
        body = {"mode": "once", "marker": str(first_run), "data": 60}
        transport.put(task_body("t-unheld", body))
        await until(first_run.exists, 30, "the first run")
        transport.held = False  # the connection is not known to be alive any more
        await asyncio.wait_for(observed.settled.wait(), 30)
        assert gone(int(first_run.read_text()))
        transport.held = True
        await transport.join()
    finally:
        runner.request_shutdown("test")
        await serving
    assert_fenced_then_run_again(transport, observed)
