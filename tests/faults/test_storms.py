"""Kill storms and freezes (issue 30): two workers on one queue, every task in a process of its
own, counted per task id, and how long two runs of one task ran at once (their markers'
beats, ``workers.beat``), against the fencing bound computed from the settings.

Marked ``storms``: left out unless ``-m`` names the mark (``.ci/run`` runs them beside its 4.0
and 4.3 passes). The machine's 3.10 broker, a vhost of the case's own: the faults are per
process (SIGSTOP, SIGKILL), never the broker's.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.broker_rules import lease_expiry_s
from async_task_api_worker.settings import load_settings
from tests.faults.conftest import Broker
from tests.faults.ledger import Case, Supervisor, worker_env
from tests.faults.test_regressions import until_markers

pytestmark = pytest.mark.storms

#: The heartbeat the workers ask for, in seconds: short, so that the broker drops a frozen
#: worker within seconds.
HEARTBEAT_S = 2
#: How long the first worker is frozen (SIGSTOP), in seconds: the issue's case.
FREEZE_S = 20.0
#: How long each task of the freeze works, in seconds: longer than the freeze.
TASK_S = 30.0
WORKER = "tests.faults.workers:beating"


def runs_of(markers: Path) -> dict[str, list[tuple[float, float]]]:
    """Each task's runs, as ``(first beat, last beat)`` (``time.monotonic()``), from markers."""
    runs: dict[str, list[tuple[float, float]]] = {}
    for marker in markers.iterdir():
        # A run killed while it wrote leaves half a line: only the whole ones count.
        beats = [float(line) for line in marker.read_text().split("\n")[:-1]]
        if beats:
            runs.setdefault(marker.name.split(".")[0], []).append((beats[0], beats[-1]))
    return runs


def overlap_s(runs: dict[str, list[tuple[float, float]]]) -> float:
    """The longest time two runs of one task were both seen running, in seconds."""
    longest = 0.0
    for task_runs in runs.values():
        for (start_a, end_a), (start_b, end_b) in itertools.combinations(task_runs, 2):
            longest = max(longest, min(end_a, end_b) - max(start_a, start_b))
    return longest


def fencing_bound_s(url: str) -> float:
    """The bound docs/isolation.md states, computed from the workers' settings."""
    settings = load_settings(
        {"broker_url": url, "broker_heartbeat_s": HEARTBEAT_S}, read_environment=False
    )
    bound = lease_expiry_s(settings)
    assert bound is not None
    return bound


@pytest.mark.timeout(300)
async def test_a_frozen_workers_children_stop_within_the_lease(
    machine_broker: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    env = {"BROKER_HEARTBEAT_S": str(HEARTBEAT_S), "WORKER_CONCURRENCY": "2"}
    case = Case(machine_broker, "freeze", markers, tmp_path, WORKER, env=env)
    first = case.worker
    first.start()
    ids = await case.publish(2, {"seconds": TASK_S})
    await until_markers(markers, 2)  # both run in the first worker's children
    second = Supervisor(WORKER, worker_env(case.url, case.name, markers, **env), tmp_path)
    second.start()
    frozen = first.current
    frozen_at = time.monotonic()
    frozen.send_signal(signal.SIGSTOP)
    try:
        await asyncio.sleep(FREEZE_S)  # the fault itself: the freeze lasts this long
    finally:
        frozen.send_signal(signal.SIGCONT)
    await case.ledger.read(case.url, case.out_queue, ids, timeout_s=120)
    counts = case.ledger.count(ids, markers, machine_broker.hung(case.vhost, case.in_queue))
    assert second.stop() == 0
    assert first.stop() == 0
    runs = runs_of(markers)
    overlap, bound = overlap_s(runs), fencing_bound_s(case.url)
    # Each task's first run is the frozen worker's, its second the other worker's.
    firsts, seconds = zip(*(sorted(task_runs) for task_runs in runs.values()), strict=True)
    stopped_s = max(end for _, end in firsts) - frozen_at
    rerun_s = min(start for start, _ in seconds) - frozen_at
    record(
        counts.row(
            f"worker frozen (SIGSTOP) {FREEZE_S:g} s beside a second one, process-isolated "
            f"tasks of {TASK_S:g} s, heartbeat {HEARTBEAT_S} s",
            broker=machine_broker.label,
            measured=f"two runs of one task overlapped {overlap:.1f} s (bound {bound:g} s): "
            f"the frozen worker's runs last seen {stopped_s:.1f} s into the freeze, the other "
            f"worker's first started {rerun_s:.1f} s into it",
        )
    )
    counts.assert_intact()
    assert counts.codes == {"success": len(ids)}  # no WORKER_CRASHED from the thawed worker
    assert counts.handler_runs == 2 * len(ids)  # each task ran again, in the second worker
    assert overlap <= bound


@pytest.mark.timeout(300)
async def test_a_kill_9_storm_under_two_workers(
    machine_broker: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    # Attempts enough for every kill to hit one task (under the vhost's broker limit of 20):
    # each task is to succeed, not to run out of attempts.
    env = {
        "BROKER_HEARTBEAT_S": str(HEARTBEAT_S),
        "WORKER_CONCURRENCY": "4",
        "WORKER_DELIVERY_LIMIT": "10",
    }
    case = Case(machine_broker, "storm", markers, tmp_path, WORKER, env=env)
    second = Supervisor(WORKER, worker_env(case.url, case.name, markers, **env), tmp_path)
    workers = (case.worker, second)
    for worker in workers:
        worker.start()
    ids = await case.publish(24, {"seconds": 2.0})
    kills = 8
    for kill, calls in enumerate(range(3, 3 * kills + 1, 3)):
        await until_markers(markers, calls)
        workers[kill % 2].kill9()
    await case.ledger.read(case.url, case.out_queue, ids, timeout_s=120)
    counts = case.ledger.count(ids, markers, machine_broker.hung(case.vhost, case.in_queue))
    assert second.stop() == 0
    assert case.worker.stop() == 0
    overlap, bound = overlap_s(runs_of(markers)), fencing_bound_s(case.url)
    record(
        counts.row(
            f"kill -9 storm: {kills} kills, two workers in turn, process-isolated tasks, "
            f"heartbeat {HEARTBEAT_S} s",
            broker=machine_broker.label,
            measured=f"two runs of one task overlapped {overlap:.1f} s (bound {bound:g} s)",
        )
    )
    counts.assert_intact()
    assert counts.codes == {"success": len(ids)}
    assert overlap <= bound
