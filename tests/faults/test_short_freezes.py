"""Freezes shorter than the lease fence nothing (issue 30, found by a breaker).

Marked ``storms``: run only when ``-m storms`` names it.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.faults.conftest import Broker
from tests.faults.ledger import Case
from tests.faults.test_regressions import until_markers
from tests.faults.test_storms import HEARTBEAT_S, WORKER

pytestmark = pytest.mark.storms

TASKS = 4
TASK_S = 40.0
FREEZES = int(os.environ.get("BRK_FREEZES", "8"))


# Under 1.75 heartbeats (the expiry less one renewal period, ``ports.RENEWALS_PER_LEASE``).
@pytest.mark.parametrize("freeze_heartbeats", [1.2, 1.5])
@pytest.mark.timeout(400)
async def test_freezes_shorter_than_the_lease_fence_nothing(
    machine_broker: Broker, markers: Path, tmp_path: Path, record: Any, freeze_heartbeats: float
) -> None:
    env = {"BROKER_HEARTBEAT_S": str(HEARTBEAT_S), "WORKER_CONCURRENCY": str(TASKS)}
    case = Case(machine_broker, "freeze", markers, tmp_path, WORKER, env=env)
    case.worker.start()
    ids = await case.publish(TASKS, {"seconds": TASK_S})
    await until_markers(markers, TASKS)
    rng = random.Random(1)
    frozen = case.worker.current
    for _ in range(FREEZES):
        await asyncio.sleep(rng.uniform(1.0, 2.0))
        frozen.send_signal(signal.SIGSTOP)
        time.sleep(freeze_heartbeats * HEARTBEAT_S)
        frozen.send_signal(signal.SIGCONT)
    await case.ledger.read(case.url, case.out_queue, ids, timeout_s=200)
    counts = case.ledger.count(ids, markers, machine_broker.hung(case.vhost, case.in_queue))
    log = case.worker.log()
    lapsed = log.count("lease_lapsed")
    reconnects = log.count("Reconnected to")
    assert case.worker.stop() == 0
    record(
        counts.row(
            f"a worker frozen {FREEZES} times for {freeze_heartbeats} heartbeats (under the "
            "lease), 4 process-isolated tasks of 40 s, heartbeat 2 s",
            broker=machine_broker.label,
            measured=f"{lapsed} lease_lapsed lines, {reconnects} reconnects",
        )
    )
    counts.assert_intact()
    assert counts.handler_runs == TASKS, "a freeze shorter than the lease fenced a task"
