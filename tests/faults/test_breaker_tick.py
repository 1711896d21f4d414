"""Breaker rows for the tick (issue 30): ticks AND detached workers killed, duplicate deliveries.

Marked ``storms``: run only when ``-m storms`` names it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from async_task_api_worker.client import build_envelope
from tests.faults.conftest import Broker
from tests.faults.ledger import Ledger, worker_env
from tests.faults.test_tick_storm import DELIVERY_LIMIT, TIMEOUT_S, Storm, unsettled

TASKS = int(os.environ.get("BRK_TASKS", "30"))
TICKS_AT_ONCE = int(os.environ.get("BRK_TICKS", "4"))
#: Each published task id is published this many times (duplicate deliveries of one task id).
COPIES = int(os.environ.get("BRK_COPIES", "2"))
#: Probability a detached worker seen running is SIGKILLed by the killer at each look.
KILL_WORKER_P = float(os.environ.get("BRK_KILL_WORKER_P", "0.15"))


async def publish(url: str, queue: str, rng: random.Random) -> list[str]:
    ids = []
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue, durable=True)
        bodies = []
        for _ in range(TASKS):
            task_id, body = build_envelope(
                {"seconds": round(rng.uniform(0.0, 3.0), 2)}, service="steady"
            )
            ids.append(task_id)
            bodies += [body] * COPIES
        rng.shuffle(bodies)
        for body in bodies:
            await channel.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=queue,
            )
    return ids


async def kill_workers(
    state: Path, rng: random.Random, calm: list[bool], killed: list[str]
) -> None:
    while not calm[0]:
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        if not state.is_dir():
            continue
        for marker in list(state.glob("*.running*")):
            if rng.random() > KILL_WORKER_P:
                continue
            with contextlib.suppress(Exception):
                pid = json.loads(marker.read_bytes()).get("pid")
                if pid:
                    os.killpg(int(pid), signal.SIGKILL)
                    killed.append(marker.name)


@pytest.mark.storms
@pytest.mark.timeout(900)
async def test_breaker_tick_storm(
    machine_broker: Broker, markers: Path, tmp_path: Path, record: Any
) -> None:
    seed = int(os.environ.get("BRK_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    vhost = machine_broker.vhost(delivery_limit=DELIVERY_LIMIT + 10)
    url = machine_broker.url(vhost)
    env = worker_env(
        url, "storm", markers, WORKER_DELIVERY_LIMIT=str(DELIVERY_LIMIT),
        WORKER_TASK_TIMEOUT_S=TIMEOUT_S,
    )  # fmt: skip
    state = tmp_path / "state"
    logs = tmp_path / "ticks"
    logs.mkdir()
    storm = Storm(state, env, logs, rng)
    ledger = Ledger()
    ids = await publish(url, "storm_in", rng)
    calm = [False]
    killed: list[str] = []
    started = time.monotonic()
    ticks = [asyncio.create_task(storm.run()) for _ in range(TICKS_AT_ONCE)]
    killer = asyncio.create_task(kill_workers(state, rng, calm, killed))
    try:
        await ledger.read(url, "storm_out", ids, timeout_s=600, linger_s=0.0)
    finally:
        storm.calm = True
        calm[0] = True
        await asyncio.gather(*ticks, killer)
    settled_s = time.monotonic() - started
    for _ in range(3 * TASKS):  # last ticks, left alone, until the queue is empty
        await storm.tick(kill=False)
        if sum(machine_broker.counts(vhost, "storm_in")) == 0 and not any(state.glob("*.running*")):
            await storm.tick(kill=False)
            break
    await ledger.read(url, "storm_out", ids, timeout_s=0.0)
    counts = ledger.count(ids, markers, machine_broker.hung(vhost, "storm_in"))
    print(json.dumps(counts.row(
        "breaker: ticks and detached workers killed, each id published twice",
        measured=f"seed {seed} {storm.ticks} ticks ({storm.killed} killed), "
        f"{len(killed)} workers killed, settled in {settled_s:.0f} s",
    )))  # fmt: skip
    print("state left:", unsettled(state), "dups", counts.duplicate_successes,
          "double", [(t, ledger.terminal(t)) for t in counts.double_conclusions])  # fmt: skip
    assert counts.lost == [], f"seed {seed}, state {unsettled(state)}"
    assert counts.duplicate_successes == [], f"seed {seed}"
    counts.assert_intact()
    assert unsettled(state) == [], f"seed {seed}"
