"""The fault suite's bookkeeping: publish tasks with known ids, read every report, count.

A case publishes N tasks, injects its fault, lets supervised workers settle them, then reads the
output queue until every task has a terminal report (and a little longer, for late duplicates).
Per task id it counts: **lost** (no terminal report), **duplicate successes** (``success`` from
more than one run: the handler succeeded twice), **double conclusions** (two terminal reports
that disagree), and **handler runs** (marker files). **Hung** is what the input queue still holds
once everything is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import aio_pika

from async_task_api_worker.client import build_envelope
from tests import polling
from tests.integration.conftest import REPO
from tests.ports import free_port

__all__ = ["Counts", "Ledger", "Supervisor", "publish_tasks", "worker_env"]


async def publish_tasks(
    url: str, queue: str, count: int, task_input: dict[str, Any], service: str = "steady"
) -> list[str]:
    """Publish ``count`` envelopes (persistent, confirmed) to ``queue``; their task ids."""
    ids: list[str] = []
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        for _ in range(count):
            task_id, body = build_envelope(task_input, service=service)
            await channel.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=queue,
            )
            ids.append(task_id)
    return ids


@dataclass
class Counts:
    """One case's counts, per task id."""

    tasks: int
    lost: list[str]
    duplicate_successes: list[str]
    double_conclusions: list[str]
    handler_runs: int
    hung: int
    codes: dict[str, int]
    attempts: dict[str, list[int]]

    def assert_intact(self, *, duplicates_at_most: int = 0) -> None:
        """Nothing lost, nothing hung, no task concluded two ways; and at most
        ``duplicates_at_most`` duplicate successes (the ack-lost-after-the-confirm window:
        never more than the tasks in flight when a worker or a connection died)."""
        assert self.lost == [], f"lost: {self.lost}"
        assert self.hung == 0, f"{self.hung} left in the input queue"
        assert self.double_conclusions == [], f"two conclusions: {self.double_conclusions}"
        assert len(self.duplicate_successes) <= duplicates_at_most, self.duplicate_successes

    def row(self, case: str, **extra: object) -> dict[str, object]:
        """The case's row of the fault table."""
        return {
            "case": case,
            "tasks": self.tasks,
            "lost": len(self.lost),
            "duplicate_successes": len(self.duplicate_successes),
            "double_conclusions": len(self.double_conclusions),
            "handler_runs": self.handler_runs,
            "hung": self.hung,
            "codes": dict(sorted(self.codes.items())),
            **extra,
        }


#: How long a reader or a publisher of the suite waits for a node, before it tries the next one.
CONNECT_TIMEOUT_S = 5.0


@dataclass
class Ledger:
    """Every report seen on the output queue, by task id."""

    reports: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    seen: set[tuple[str, bytes]] = field(default_factory=set)
    arrivals: list[tuple[float, str, str]] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _reading: asyncio.Event = field(default_factory=asyncio.Event)
    #: The reader's own end (see ``steady_stream``: a cancel can be lost in a failed close).
    _ending: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, body: bytes, message_id: str | None) -> None:
        """Record one report; the same report published again (its message id and its bytes:
        a report is encoded once) counts once.

        The message id alone is not the key: it is unique per delivery only (docs/protocol.md),
        and RabbitMQ 4.3 hands one attempt out again after a give-back or a consumer timeout,
        so a terminal report may carry the id of an earlier hand-out's ``started``.
        """
        try:
            report = json.loads(body)
        except ValueError:
            return
        if not isinstance(report, dict) or "task_id" not in report:
            return
        if message_id is not None:
            if (message_id, body) in self.seen:
                return
            self.seen.add((message_id, body))
        self.reports[str(report["task_id"])].append(report)
        self.arrivals.append((time.monotonic(), str(report["task_id"]), str(report.get("type"))))

    def terminal(self, task_id: str) -> list[dict[str, Any]]:
        """The task's ``success`` and ``failure`` reports."""
        return [r for r in self.reports.get(task_id, []) if r.get("type") in ("success", "failure")]

    @contextlib.asynccontextmanager
    async def consuming(self, url: str | Sequence[str], queue: str) -> AsyncIterator[None]:
        """Record every report of ``queue`` (acking it) while the block runs.

        ``url`` may be several (a cluster's nodes): the reader moves on to the next one when its
        node goes, instead of waiting for that node to come back.
        """
        urls = [url] if isinstance(url, str) else list(url)
        self._reading.clear()
        self._ending.clear()
        reading = asyncio.create_task(self._read_from(urls, queue))
        try:
            await self._reading.wait()
            yield
        finally:
            self._ending.set()
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading

    async def _read_from(self, urls: list[str], queue: str) -> None:
        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            self.add(message.body, message.message_id)
            await message.ack()
            self._changed.set()

        for url in itertools.cycle(urls):
            if self._ending.is_set():
                return
            with contextlib.suppress(Exception):
                connection = await asyncio.wait_for(aio_pika.connect(url), CONNECT_TIMEOUT_S)
                async with connection:
                    channel = await connection.channel()
                    await channel.set_qos(prefetch_count=200)
                    out = await channel.declare_queue(queue, durable=True)
                    await out.consume(on_message)
                    self._reading.set()
                    while not channel.is_closed and not self._ending.is_set():
                        await asyncio.sleep(0.1)
            await asyncio.sleep(0.2)

    async def read(
        self, url: str, queue: str, ids: Iterable[str], timeout_s: float, linger_s: float = 3.0
    ) -> None:
        """Consume ``queue`` until every id has a terminal report, then ``linger_s`` more."""
        wanted = set(ids)
        async with self.consuming(url, queue):
            deadline = time.monotonic() + timeout_s
            while not all(self.terminal(task_id) for task_id in wanted):
                self._changed.clear()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)
            await asyncio.sleep(linger_s)

    def count(self, ids: list[str], markers: Path, hung: int) -> Counts:
        """Count ``ids`` against what was read and the handler's markers."""
        runs: dict[str, int] = defaultdict(int)
        for marker in markers.iterdir():
            runs[marker.name.split(".")[0]] += 1
        lost, duplicates, double = [], [], []
        codes: dict[str, int] = defaultdict(int)
        attempts: dict[str, list[int]] = {}
        for task_id in ids:
            terminal = self.terminal(task_id)
            if not terminal:
                lost.append(task_id)
                continue
            # Each success left is a publication of its own (copies of one are dropped in add):
            # two are two handler runs that succeeded, of one attempt number too on 4.3.
            if sum(r["type"] == "success" for r in terminal) > 1:
                duplicates.append(task_id)
            kinds = {(r["type"], (r.get("error") or {}).get("code")) for r in terminal}
            if len(kinds) > 1:
                double.append(task_id)
            for kind, code in kinds:
                codes[code or kind] += 1
            attempts[task_id] = sorted({r["attempt"] for r in self.reports[task_id]})
        return Counts(
            tasks=len(ids),
            lost=lost,
            duplicate_successes=duplicates,
            double_conclusions=double,
            handler_runs=sum(runs[task_id] for task_id in ids),
            hung=hung,
            codes=dict(codes),
            attempts=attempts,
        )


def worker_env(url: str, queue: str, markers: Path, **overrides: str) -> dict[str, str]:
    """The environment of a fault-suite worker on ``queue``_in / ``queue``_out."""
    environment = dict(os.environ)
    environment.update(
        BROKER_URL=url,
        IN_QUEUE_NAME=f"{queue}_in",
        OUT_QUEUE_NAME=f"{queue}_out",
        ATW_TEST_MARKERS=str(markers),
        HEALTH_CHECK_HOST="127.0.0.1",
        HEALTH_CHECK_PORT=str(free_port()),
        PYTHONUNBUFFERED="1",
        WORKER_CONCURRENCY="4",
        WORKER_DELIVERY_LIMIT="3",
        WORKER_RETRY_BACKOFF_S="0.1",
        WORKER_RETRY_BACKOFF_MAX_S="2",
        BROKER_HEARTBEAT_S="5",
    )
    environment.update(overrides)
    return environment


class Supervisor:
    """Keeps one worker process running, as a supervisor would: a worker that exits is started
    again (after ``restart_delay_s``), until :meth:`stop`.

    Args:
        target: ``module:worker``.
        env: the worker's environment.
        logs: the folder the workers' output goes to (one file per process).
    """

    #: Every supervisor of the running case, so that a failed case leaves no worker behind.
    live: ClassVar[list[Supervisor]] = []

    def __init__(self, target: str, env: dict[str, str], logs: Path) -> None:
        Supervisor.live.append(self)
        self.target = target
        self.env = env
        self.logs = logs
        self.processes: list[subprocess.Popen[bytes]] = []
        self.paths: list[Path] = []
        self._stopping = False
        self.restarts = 0

    @property
    def probes(self) -> str:
        """The probes server of the current process."""
        return f"http://127.0.0.1:{self.env['HEALTH_CHECK_PORT']}"

    @property
    def current(self) -> subprocess.Popen[bytes]:
        return self.processes[-1]

    def start(self) -> None:
        """Start a worker process, and wait until it says it is connected."""
        path = self.logs / f"worker-{uuid.uuid4().hex[:6]}.log"
        self.paths.append(path)
        with path.open("wb") as out:
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "async_task_api_worker", "run", self.target],
                    cwd=REPO,
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        self.wait_for("Connected to", path=path)

    def log(self) -> str:
        """Everything every worker process wrote, in order."""
        return "".join(path.read_text(errors="replace") for path in self.paths)

    def wait_for(
        self, text: str, timeout_s: float = 60.0, path: Path | None = None, count: int = 1
    ) -> float:
        """Wait until ``text`` appears ``count`` times in the log; the monotonic time then."""

        def log() -> str:
            return path.read_text(errors="replace") if path else self.log()

        polling.wait_for(
            lambda: log().count(text) >= count,
            timeout_s,
            lambda: f"{text!r} x{count}:\n{log()[-4000:]}",
        )
        return time.monotonic()

    def kill9(self) -> None:
        """SIGKILL the current worker (its fork server and children die with it), start anew."""
        self.current.send_signal(signal.SIGKILL)
        self.current.wait(30)
        self.restarts += 1
        self.start()

    def keep_running(self) -> None:
        """Start a new worker if the current one has exited (a supervisor's loop, one turn)."""
        if self.current.poll() is not None and not self._stopping:
            self.restarts += 1
            self.start()

    def kill_all(self) -> None:
        """SIGKILL every process this supervisor started that still runs."""
        self._stopping = True
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    def stop(self) -> int | None:
        """SIGTERM the current worker and wait for it; its exit code."""
        self._stopping = True
        process = self.current
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                return process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode


def decisions(log: str, predicate: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """The worker log's JSON lines for which ``predicate`` holds."""
    lines = []
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and predicate(record):
            lines.append(record)
    return lines


@dataclass
class Case:
    """One fault case: a vhost of its own on ``broker``, a supervised worker on
    ``<name>_in``/``<name>_out``, its tasks, and their counts at the end."""

    broker: Any
    name: str
    markers: Path
    logs: Path
    target: str = "tests.faults.workers:steady"
    quorum: bool = True
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.vhost = self.broker.vhost(quorum=self.quorum)
        self.url = self.broker.url(self.vhost)
        self.in_queue, self.out_queue = f"{self.name}_in", f"{self.name}_out"
        self.worker = Supervisor(
            self.target, worker_env(self.url, self.name, self.markers, **self.env), self.logs
        )
        self.ledger = Ledger()

    async def publish(
        self, count: int, task_input: dict[str, Any], service: str = "steady"
    ) -> list[str]:
        """Publish ``count`` tasks to the input queue; their ids."""
        return await publish_tasks(self.url, self.in_queue, count, task_input, service)

    async def settle(self, ids: list[str], timeout_s: float = 120.0) -> Counts:
        """Read every report of ``ids``, count them, and stop the worker (it must exit 0)."""
        await self.ledger.read(self.url, self.out_queue, ids, timeout_s=timeout_s)
        counts = self.ledger.count(ids, self.markers, self.broker.hung(self.vhost, self.in_queue))
        assert self.worker.stop() == 0
        return counts
