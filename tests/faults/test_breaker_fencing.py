"""Breaker rows for fencing (issue 30): freezes shorter than the lease must not fence.

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

import pytest

from tests.faults.conftest import Broker
from tests.faults.ledger import Case
from tests.faults.test_regressions import until_markers
from tests.faults.test_storms import HEARTBEAT_S, WORKER, runs_of

pytestmark = pytest.mark.storms

TASKS = 4
TASK_S = 40.0
FREEZES = int(os.environ.get("BRK_FREEZES", "8"))


@pytest.mark.parametrize("freeze_heartbeats", [1.2, 1.7])
@pytest.mark.timeout(400)
async def test_breaker_short_freezes(
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


class Proxy:
    """A TCP proxy that can go silent (a partition: sockets open, nothing passes)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.open = asyncio.Event()
        self.open.set()
        self.port = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self.server = server

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    await self.open.wait()
                    writer.write(data)
                    await writer.drain()
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self.writers += [writer, up_writer]
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))


@pytest.mark.parametrize("partition_s", [30.0])
@pytest.mark.timeout(400)
async def test_breaker_partition(
    machine_broker: Broker, markers: Path, tmp_path: Path, partition_s: float
) -> None:
    from tests.faults.ledger import Supervisor, worker_env
    from tests.faults.test_storms import fencing_bound_s, overlap_s

    env = {"BROKER_HEARTBEAT_S": str(HEARTBEAT_S), "WORKER_CONCURRENCY": str(TASKS)}
    case = Case(machine_broker, "part", markers, tmp_path, WORKER, env=env)
    port = int(case.url.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    proxy = Proxy(port)
    await proxy.start()
    proxied = case.url.replace(f":{port}/", f":{proxy.port}/")
    first = Supervisor(WORKER, worker_env(proxied, case.name, markers, **env), tmp_path)
    first.start()
    ids = await case.publish(TASKS, {"seconds": 20.0})
    await until_markers(markers, TASKS)
    second = Supervisor(WORKER, worker_env(case.url, case.name, markers, **env), tmp_path)
    second.start()
    cut_at = time.monotonic()
    proxy.open.clear()
    await asyncio.sleep(partition_s)
    proxy.open.set()
    await case.ledger.read(case.url, case.out_queue, ids, timeout_s=200)
    counts = case.ledger.count(ids, markers, machine_broker.hung(case.vhost, case.in_queue))
    assert second.stop() == 0
    assert first.stop() == 0
    runs = runs_of(markers)
    firsts = [min(r) for r in runs.values()]
    stopped_s = max(end for _, end in firsts) - cut_at
    print(json.dumps({
        "tasks": TASKS, "lost": len(counts.lost), "dups": len(counts.duplicate_successes),
        "double": len(counts.double_conclusions), "hung": counts.hung,
        "handler_runs": counts.handler_runs, "codes": counts.codes,
        "first_runs_stopped_s_after_cut": round(stopped_s, 2),
        "overlap_s": round(overlap_s(runs), 2), "bound_s": fencing_bound_s(case.url),
        "first_log_lapsed": first.log().count("lease_lapsed"),
    }))  # fmt: skip
    counts.assert_intact()
    assert overlap_s(runs) <= fencing_bound_s(case.url)
