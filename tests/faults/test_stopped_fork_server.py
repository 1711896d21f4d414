"""A fork server stopped (SIGSTOP) for two leases, process-isolated tasks running (issue 30,
found by a breaker). Marked ``storms``: run only when ``-m storms`` names it.

The tasks the fork server forked run in groups of their own and hold their leases: a fork
server that does not answer must not make them fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.broker_rules import lease_expiry_s
from async_task_api_worker.settings import load_settings
from tests.faults.conftest import Broker
from tests.faults.ledger import Case
from tests.faults.test_regressions import until_markers
from tests.faults.test_storms import HEARTBEAT_S, WORKER

pytestmark = pytest.mark.storms

TASKS = 3


def fork_server_of(worker: int) -> int:
    """The pid of ``worker``'s one child: its fork server."""
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(worker)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(out) == 1, out
    return int(out[0])


@pytest.mark.timeout(300)
async def test_a_stopped_fork_server_fails_no_running_task(
    machine_broker: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    env = {"BROKER_HEARTBEAT_S": str(HEARTBEAT_S), "WORKER_CONCURRENCY": str(2 * TASKS)}
    case = Case(machine_broker, "fsrv", markers, tmp_path, WORKER, env=env)
    settings = load_settings(
        {"broker_url": case.url, "broker_heartbeat_s": HEARTBEAT_S}, read_environment=False
    )
    expiry_s = lease_expiry_s(settings)
    assert expiry_s is not None
    case.worker.start()
    running = await case.publish(TASKS, {"seconds": 4 * expiry_s})
    await until_markers(markers, TASKS)
    server = fork_server_of(case.worker.current.pid)
    os.kill(server, signal.SIGSTOP)
    try:
        later = await case.publish(TASKS, {"seconds": 1.0})  # each asks the stopped server
        await asyncio.sleep(2 * expiry_s)  # the fault itself: it lasts this long
    finally:
        with contextlib.suppress(ProcessLookupError):  # the worker may have killed it
            os.kill(server, signal.SIGCONT)
    counts = await case.settle(running + later, timeout_s=150)
    record(
        counts.row(
            f"fork server stopped (SIGSTOP) {2 * expiry_s:g} s, {TASKS} process-isolated tasks "
            f"running and {TASKS} more asked for, heartbeat {HEARTBEAT_S} s",
            broker=machine_broker.label,
        )
    )
    counts.assert_intact()
    # Before the fix: the server was killed after 2 s (forkserver.SPAWN_TIMEOUT_S), its healthy
    # running tasks with it, each concluded WORKER_CRASHED ("its fork server stopped").
    assert counts.codes == {"success": 2 * TASKS}
