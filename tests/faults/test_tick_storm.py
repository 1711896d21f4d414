"""The tick kill storm (issue 30): ``tick`` processes killed whole at random moments.

Five ``tick`` processes on one queue at a time, each started again once it ended, and each
killed (its whole process group, SIGKILL, as a cron's budget kill) at a random moment of its
life, until every task settled: 50 tasks of 1 to 5 s, counted per task id. Before issue 30, a
tick killed between a hand-out's input and its marker left the input alone, the next tick
acked the redelivery as handed out, and the task never ended (one lost in each of two storms).
A second row (a breaker's) also kills detached workers at random and publishes each task id
twice (two deliveries of one task, at two ticks at once).
Marked ``storms``: it runs only when ``-m storms`` names it (minutes, not the README's run).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from async_task_api_worker.client import build_envelope
from tests.faults.conftest import Broker
from tests.faults.ledger import Ledger, worker_env
from tests.integration.conftest import REPO

TARGET = "tests.faults.workers:steady"
TICKS_AT_ONCE = 5
#: The tasks of a storm, by the copies of each published: 50, or 30 published twice.
TASKS = {1: 50, 2: 30}
TASK_SECONDS = (1.0, 5.0)
#: A tick's budget and the tasks it takes: it lives about 3 s (start, sweep, hand-outs, close).
BUDGET_S = "10"
MAX_NEW = "1"
#: A tick is killed at a moment drawn from this range, in seconds after its start.
KILL_WITHIN_S = (0.5, 4.0)
#: The task timeout: a task handed out whose worker never started is reported after it.
TIMEOUT_S = "20"
#: Above any task's redeliveries here (each kill gives back at most one delivery): none is
#: abandoned, so that every task shows how its hand-out ended. The broker's limit is above it.
DELIVERY_LIMIT = 20
#: The share of the running detached workers killed at each look, in the second row.
KILL_WORKER_P = 0.15
#: The longest the storm may take to settle every task, seconds.
SETTLE_WITHIN_S = 420.0


@dataclass
class Storm:
    """The ticks of one storm: how many ran, how many were killed."""

    state: Path
    env: dict[str, str]
    logs: Path
    rng: random.Random
    ticks: int = 0
    killed: int = 0
    calm: bool = False

    async def tick(self, *, kill: bool) -> None:
        """Run one tick in a process group of its own; with ``kill``, SIGKILL the group at a
        random moment (unless it ended before)."""
        with (self.logs / f"tick-{self.ticks}.log").open("wb") as log:
            self.ticks += 1
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "async_task_api_worker", "tick", TARGET,
                "--state-dir", str(self.state), "--budget-s", BUDGET_S, "--max-new", MAX_NEW,
                cwd=REPO, env=self.env, stdout=log, stderr=log, start_new_session=True,
            )  # fmt: skip
            if kill:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), self.rng.uniform(*KILL_WITHIN_S))
                if process.returncode is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    self.killed += 1
            await process.wait()
        assert process.returncode != 2, (self.logs / f"tick-{self.ticks - 1}.log").read_text()

    async def run(self) -> None:
        """Start ticks again and again (each killed at a random moment) until calm."""
        while not self.calm:
            await self.tick(kill=True)


async def publish(url: str, queue: str, rng: random.Random, copies: int) -> list[str]:
    """Publish the storm's tasks (persistent, confirmed), 1 to 5 s each, each ``copies`` times
    (shuffled); their ids."""
    ids, bodies = [], []
    for _ in range(TASKS[copies]):
        task_id, body = build_envelope(
            {"seconds": round(rng.uniform(*TASK_SECONDS), 2)}, service="steady"
        )
        ids.append(task_id)
        bodies += [body] * copies
    rng.shuffle(bodies)
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue, durable=True)  # a quorum queue: the vhost's default
        for body in bodies:
            await channel.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=queue,
            )
    return ids


async def kill_workers(storm: Storm, killed: list[str]) -> None:
    """SIGKILL the group of a running detached worker now and then (15 % of those seen at
    each look, every 0.2 to 1 s) until the storm is calm."""
    while not storm.calm:
        await asyncio.sleep(storm.rng.uniform(0.2, 1.0))
        for marker in storm.state.glob("*.running*") if storm.state.is_dir() else ():
            if storm.rng.random() > KILL_WORKER_P:
                continue
            with contextlib.suppress(OSError, ValueError):  # gone, or half written
                pid = json.loads(marker.read_bytes()).get("pid")
                if pid:
                    os.killpg(int(pid), signal.SIGKILL)
                    killed.append(marker.name)


def unsettled(state: Path) -> list[str]:
    """What the state directory holds but a task's ``.done``: work not concluded, leftovers."""
    return sorted(path.name for path in state.iterdir() if not path.name.endswith(".done"))


#: Its row's words, by the copies of each task id published: with two, detached workers are
#: killed at random too (a breaker's row).
ROWS = {
    1: "the tick kill storm: 5 ticks at once, each killed (SIGKILL to its group) at a random "
    "moment, 50 tasks of 1 to 5 s, until all settled",
    2: "the same with detached workers killed at random too, 30 tasks each published twice",
}


@pytest.mark.storms
@pytest.mark.timeout(900)
@pytest.mark.parametrize("copies", sorted(ROWS), ids=["ticks", "ticks_workers_copies"])
async def test_the_tick_kill_storm(
    machine_broker: Broker, markers: Path, tmp_path: Path, record: Any, copies: int
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    vhost = machine_broker.vhost(delivery_limit=DELIVERY_LIMIT + 10)
    url = machine_broker.url(vhost)
    env = worker_env(
        url,
        "storm",
        markers,
        WORKER_DELIVERY_LIMIT=str(DELIVERY_LIMIT),
        WORKER_TASK_TIMEOUT_S=TIMEOUT_S,
    )
    state = tmp_path / "state"
    logs = tmp_path / "ticks"
    logs.mkdir()
    storm = Storm(state, env, logs, rng)
    ledger = Ledger()
    ids = await publish(url, "storm_in", rng, copies)
    started = time.monotonic()
    killed: list[str] = []
    ticks = [asyncio.create_task(storm.run()) for _ in range(TICKS_AT_ONCE)]
    if copies > 1:
        ticks.append(asyncio.create_task(kill_workers(storm, killed)))
    try:
        await ledger.read(url, "storm_out", ids, timeout_s=SETTLE_WITHIN_S, linger_s=0.0)
    finally:
        storm.calm = True
        await asyncio.gather(*ticks)
    settled_s = time.monotonic() - started
    # Last ticks, left alone, until the queue and the state are empty: anything still to send
    # goes out, and a task's other copy is acked as handed out.
    for _ in range(copies * TASKS[copies]):
        await storm.tick(kill=False)
        if sum(machine_broker.counts(vhost, "storm_in")) == 0 and not unsettled(state):
            break
    await ledger.read(url, "storm_out", ids, timeout_s=0.0)  # and late duplicates arrive
    counts = ledger.count(ids, markers, machine_broker.hung(vhost, "storm_in"))
    record(
        counts.row(
            ROWS[copies],
            broker=machine_broker.label,
            measured=f"{storm.ticks} ticks ({storm.killed} killed), {len(killed)} detached "
            f"workers killed, settled in {settled_s:.0f} s",
        )
    )
    assert counts.lost == [], f"seed {seed}, state {unsettled(state)}"
    assert counts.duplicate_successes == [], f"seed {seed}"
    counts.assert_intact()
    assert unsettled(state) == [], f"seed {seed}"  # no marker, result, input or leftover
    assert storm.killed > 0
