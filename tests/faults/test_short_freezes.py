"""Freezes shorter than the lease fence nothing (issue 30, found by a breaker).

Marked ``storms``: run only when ``-m storms`` names it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.faults.conftest import Broker
from tests.faults.ledger import Case
from tests.faults.test_regressions import until_markers
from tests.faults.test_storms import HEARTBEAT_S, WORKER, runs_of

pytestmark = pytest.mark.storms

TASKS = 4
TASK_S = 40.0
FREEZES = int(os.environ.get("BRK_FREEZES", "8"))


# Under 1.75 heartbeats (the expiry less one renewal period, ``ports.RENEWALS_PER_LEASE``).
@pytest.mark.parametrize("freeze_heartbeats", [1.2, 1.5])
@pytest.mark.timeout(400)
async def test_freezes_shorter_than_the_lease_fence_nothing(
    machine_broker: Broker, markers: Path, tmp_path: Path, freeze_heartbeats: float
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
    reconnects = log.count("Connected to") - 1
    assert case.worker.stop() == 0
    print(json.dumps({
        "freeze_heartbeats": freeze_heartbeats, "freezes": FREEZES, "tasks": TASKS,
        "lost": len(counts.lost), "dups": len(counts.duplicate_successes),
        "double": len(counts.double_conclusions), "hung": counts.hung,
        "handler_runs": counts.handler_runs, "lease_lapsed_lines": lapsed,
        "reconnects": reconnects, "codes": counts.codes,
        "runs": {k: len(v) for k, v in runs_of(markers).items()},
    }))  # fmt: skip
    counts.assert_intact()
    assert counts.handler_runs == TASKS, "a freeze shorter than the lease fenced a task"
