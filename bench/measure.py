"""One run of one contender: idle RSS, drain N tasks, then round trips at idle, then SIGTERM.

Each run gets a fresh vhost (``rabbitmqctl``) whose default queue type is the one asked for.

- Idle memory: the worker is started on the empty vhost, and once it has as many consumers on
  the input queue as it has processes, and 1 s more, its tree's ``VmRSS`` is read; then the
  whole tree is killed (SIGKILL).
- The N tasks are then published, and only then is the worker started again, for the rest.
  The worker command may start more processes (Celery's prefork pool, the supervisors of
  ``--processes``/``--workers``): its CPU and memory are the sums over its process tree.

- Throughput: N over the time from the first report (result, or finished task) to the N-th
  terminal one; the worker's start-up is not counted.
- Memory: the resident set (``VmRSS``, summed over the worker's process tree) after 1,000
  tasks and after the N-th; the peak is the sum of each process's ``VmHWM``.
- Round trip (contenders that report): publish one task, wait for its terminal report, one at
  a time, with the worker idle.
- CPU: the worker's user and system time per task, from its first finished task to the last,
  summed over its process tree, with the children that a process of the tree reaped
  (``cutime``/``cstime``: process isolation's children, a supervisor's restarted workers);
  the same for the broker (the ``beam.smp`` that listens on the broker URL's port), which
  shares the machine's cores.
- Shutdown: from SIGTERM to the worker's exit, with nothing in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import tempfile
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from bench.contenders import IN_QUEUE, OUT_QUEUE, Contender

__all__ = [
    "IN_QUEUE",
    "OUT_QUEUE",
    "Run",
    "Skipped",
    "kill_tree",
    "one_run",
    "process_tree",
    "rabbitmqctl",
]

REPO = Path(__file__).resolve().parents[1]
_DONE_LINE_BYTES = 21  # bench/peers/_done.py writes fixed-width lines
_RSS_EARLY_TASKS = 1_000
_IDLE_SETTLE_S = 1.0  # after the consumers appear, before the idle RSS is read
_START_TIMEOUT_S = 120.0
_PARTIAL_START_S = 10.0  # a skip_hint contender with too few consumers for this long: skip
REDIS_URL = os.environ.get("BENCH_REDIS_URL") or "redis://127.0.0.1:6379/0"
# The broker: the machine's, unless the environment names another one, as for the
# integration tests (docs/brokers.md): its URL (the vhost is replaced) and its rabbitmqctl.
BROKER_URL = os.environ.get("ATW_RABBITMQ_URL") or "amqp://guest:guest@127.0.0.1:5672/"
RABBITMQCTL = shlex.split(os.environ.get("ATW_RABBITMQCTL") or "rabbitmqctl")


def rabbitmqctl(*arguments: str) -> str:
    """Run the broker's ``rabbitmqctl``; its standard output."""
    return subprocess.run(  # noqa: S603 - our own arguments
        [*RABBITMQCTL, *arguments],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _vhost_url(vhost: str) -> str:
    return urllib.parse.urlsplit(BROKER_URL)._replace(path="/" + vhost).geturl()


class Skipped(Exception):
    """The contender cannot run on this checkout (its ``skip_hint`` and the worker's words)."""


@dataclass
class Run:
    """One run's figures (times in seconds, memory in MiB).

    ``idle_rss_mb`` is ``None`` in results written before it was measured.
    """

    tasks_per_s: float
    cpu_ms_per_task: float
    broker_cpu_ms_per_task: float
    rss_early_mb: float
    rss_end_mb: float
    peak_rss_mb: float
    shutdown_s: float
    exit_code: int
    round_trips_s: list[float]
    idle_rss_mb: float | None = None


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from ``/proc/<pid>/task/*/children``)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo.extend(int(child) for child in (task / "children").read_text().split())
            except OSError:
                continue
    return found


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``process`` and every descendant it has now, then reap ``process``."""
    tree = process_tree(process.pid)
    for pid in tree:  # the root first: a supervisor must not restart the children
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


def _cpu_s(pids: list[int]) -> float:
    """CPU time of ``pids`` and of their reaped children, in seconds (``/proc/<pid>/stat``).

    User plus system time of each process (``utime``, ``stime``), plus that of the children it
    has waited for (``cutime``, ``cstime``): a child that ran and was reaped between two
    readings (process isolation's, a restarted worker) is counted once, in its parent.
    """
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes that listen on TCP ``port`` (``/proc/net/tcp``, ``tcp6``)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                inodes.add(fields[9])
    return inodes


def broker_pids() -> list[int]:
    """The pids of the broker's Erlang VM (``beam.smp``), whose CPU per task is reported too.

    The ``beam.smp`` that listens on the broker URL's port: the machine may run other nodes
    (a test suite's own), and each ``rabbitmqctl`` is a short-lived ``beam.smp`` too. When
    no such socket is found (another network namespace), every ``beam.smp`` but the CLI's.
    """
    beams = []
    for status in Path("/proc").glob("[0-9]*/comm"):
        try:
            if status.read_text().strip() != "beam.smp":
                continue
            if b"escript" in (status.parent / "cmdline").read_bytes():  # rabbitmqctl & co.
                continue
        except OSError:
            continue
        beams.append(int(status.parent.name))
    sockets = {f"socket:[{inode}]" for inode in _listening_inodes(_broker_port())}
    for pid in beams:
        try:
            if any(os.readlink(fd) in sockets for fd in Path(f"/proc/{pid}/fd").iterdir()):
                return [pid]
        except OSError:
            continue
    return beams


def _broker_port() -> int:
    return urllib.parse.urlsplit(BROKER_URL).port or 5672


def _status_mb(pids: list[int], field: str) -> float:
    total_kb = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(field):
                    total_kb += int(line.split()[1])
        except OSError:
            continue
    return total_kb / 1024


class _Reports:
    """Counts the terminal reports on the output queue and hands round-trip answers out."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.terminal = 0
        self.last = 0.0
        self.waiting: dict[str, asyncio.Future[float]] = {}

    async def on_report(self, message: AbstractIncomingMessage) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        kind = message.type
        body: dict[str, object] | None = None
        if kind is None or self.waiting:
            body = json.loads(message.body)
            # A report's "type"; a Celery result's "status" (SUCCESS, FAILURE, STARTED...).
            kind = kind or str(body.get("type") or body.get("status", "")).lower()
        if kind not in ("success", "failure"):
            return
        self.terminal += 1
        self.last = now
        if body is not None and (waiter := self.waiting.pop(str(body.get("task_id")), None)):
            waiter.set_result(now)


async def _drain_and_probe(
    contender: Contender, url: str, env: dict[str, str], tasks: int, round_trips: int
) -> tuple[Run, subprocess.Popen[bytes]]:
    done_file = Path(env["BENCH_DONE_FILE"])
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=2000)
        out = await channel.declare_queue(OUT_QUEUE, durable=True)
        reports = _Reports()
        await out.consume(reports.on_report, no_ack=True)
        process = subprocess.Popen(  # noqa: S603, ASYNC220 - our own command, started once
            contender.argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL
        )
        try:
            return await _measure(
                contender,
                process,
                reports=reports,
                channel=channel,
                done_file=done_file,
                tasks=tasks,
                round_trips=round_trips,
            )
        except BaseException:
            # A failed or interrupted run must not leave the worker running on a deleted vhost.
            kill_tree(process)
            raise


async def consumer_count(connection: aio_pika.abc.AbstractConnection, queue: str) -> int:
    """The consumers of ``queue`` (0 if it does not exist yet), from a passive declare."""
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
    except aio_pika.exceptions.ChannelNotFoundEntity:
        return 0
    finally:
        if not channel.is_closed:
            await channel.close()
    result = declared.declaration_result
    return int(result.consumer_count or 0)


def _give_up(contender: Contender, what: str, log: Path) -> NoReturn:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    last = f"; its last words: {lines[-1].strip()[:400]}" if lines else ""
    if contender.skip_hint:
        raise Skipped(f"{contender.key}: {what} ({contender.skip_hint}){last}")
    raise RuntimeError(f"{contender.key}: {what}{last}")


async def _idle_rss(contender: Contender, url: str, env: dict[str, str], log: Path) -> float:
    """Start the worker on the empty vhost; its tree's RSS once it consumes, then kill it."""
    connection = await aio_pika.connect(url)
    async with connection:
        with log.open("wb") as stderr:
            process = subprocess.Popen(  # noqa: S603, ASYNC220 - our own command, started once
                contender.argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr
            )
        try:
            started = time.monotonic()
            first_consumer: float | None = None
            while (count := await consumer_count(connection, IN_QUEUE)) < contender.processes:
                now = time.monotonic()
                if process.poll() is not None:
                    _give_up(contender, f"exited with {process.returncode} at start-up", log)
                if count and first_consumer is None:
                    first_consumer = now
                if (
                    contender.skip_hint
                    and first_consumer is not None
                    and now - first_consumer > _PARTIAL_START_S
                ):
                    _give_up(
                        contender,
                        f"{count} consumer(s) on the input queue, not {contender.processes}, "
                        f"{_PARTIAL_START_S:.0f} s after the first",
                        log,
                    )
                if now - started > _START_TIMEOUT_S:
                    _give_up(contender, f"not consuming {_START_TIMEOUT_S:.0f} s after start", log)
                await asyncio.sleep(0.05)
            await asyncio.sleep(_IDLE_SETTLE_S)
            return _status_mb(process_tree(process.pid), "VmRSS:")
        finally:
            kill_tree(process)


async def _measure(
    contender: Contender,
    process: subprocess.Popen[bytes],
    *,
    reports: _Reports,
    channel: aio_pika.abc.AbstractChannel,
    done_file: Path,
    tasks: int,
    round_trips: int,
) -> tuple[Run, subprocess.Popen[bytes]]:
    deadline = time.monotonic() + 120 + tasks / 50
    rss_early: float | None = None
    cpu_at_start: tuple[int, float, float] | None = None
    broker = broker_pids()

    def finished() -> int:
        if contender.timed_on_out_queue:
            return reports.terminal
        try:
            return done_file.stat().st_size // _DONE_LINE_BYTES
        except FileNotFoundError:
            return 0

    while (count := finished()) < tasks:
        if process.poll() is not None:
            raise RuntimeError(f"{contender.key} exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{contender.key}: {count} of {tasks} tasks done in time")
        if cpu_at_start is None and count > 0:
            cpu_at_start = (count, _cpu_s(process_tree(process.pid)), _cpu_s(broker))
        if rss_early is None and count >= _RSS_EARLY_TASKS:
            rss_early = _status_mb(process_tree(process.pid), "VmRSS:")
        await asyncio.sleep(0.01)
    tree = process_tree(process.pid)
    rss_end = _status_mb(tree, "VmRSS:")
    started_count, started_cpu, broker_cpu = cpu_at_start or (0, 0.0, 0.0)
    cpu_ms = 1000 * (_cpu_s(tree) - started_cpu) / max(1, count - started_count)
    broker_ms = 1000 * (_cpu_s(broker) - broker_cpu) / max(1, count - started_count)
    if rss_early is None:  # fewer tasks than that: the end is the early figure too
        rss_early = rss_end
    if contender.timed_on_out_queue:
        first, last = reports.first or reports.last, reports.last
    else:
        stamps = [float(line) for line in done_file.read_text().split()]  # noqa: ASYNC240
        first, last = min(stamps), max(stamps)
    samples = await _round_trips(contender, channel, reports, round_trips)
    peak = _status_mb(process_tree(process.pid), "VmHWM:")
    run = Run(tasks / (last - first), cpu_ms, broker_ms, rss_early, rss_end, peak, 0.0, 0, samples)
    return run, process


async def _round_trips(
    contender: Contender, channel: aio_pika.abc.AbstractChannel, reports: _Reports, count: int
) -> list[float]:
    if contender.envelope is None or count == 0:
        return []
    loop = asyncio.get_running_loop()
    samples: list[float] = []
    for number in range(count + 10):  # the first 10 warm the path up and are not kept
        task_id = f"rt-{number}-{uuid.uuid4().hex[:6]}"
        waiter: asyncio.Future[float] = loop.create_future()
        reports.waiting[task_id] = waiter
        sent = time.monotonic()
        await channel.default_exchange.publish(
            aio_pika.Message(
                contender.envelope(task_id),
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key=IN_QUEUE,
        )
        answered = await asyncio.wait_for(waiter, 30)
        if number >= 10:
            samples.append(answered - sent)
    return samples


def _stop(process: subprocess.Popen[bytes], how: signal.Signals) -> int:
    """Signal the worker, wait for it (60 s, then SIGKILL), and return its exit code."""
    if process.poll() is None:
        process.send_signal(how)
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def one_run(
    contender: Contender, tasks: int, *, round_trips: int, queue_type: str = "classic"
) -> Run:
    """Drain ``tasks`` with ``contender`` once, in a vhost of its own; see the module's doc.

    Raises:
        Skipped: the contender has a ``skip_hint`` and its worker did not start as asked.
    """
    vhost = f"bench-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", vhost, "--default-queue-type", queue_type)
    user = urllib.parse.unquote(urllib.parse.urlsplit(BROKER_URL).username or "guest")
    rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
    try:
        url = _vhost_url(vhost)
        with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
            env = {
                **os.environ,
                "BROKER_URL": url,
                "IN_QUEUE_NAME": IN_QUEUE,
                "OUT_QUEUE_NAME": OUT_QUEUE,
                "HEALTH_CHECK_PORT": "0",
                "LOG_LEVEL": "WARNING",
                "BENCH_DONE_FILE": str(Path(scratch) / "done"),
                # The peers take the vhost's queue type (bench/peers/_common.py) and keep
                # their results on Redis under keys of this run's own.
                "BENCH_QUEUE_TYPE": queue_type,
                "BENCH_REDIS_URL": REDIS_URL,
                "BENCH_RUN_ID": vhost,
                **contender.env,
            }
            idle_rss = asyncio.run(_idle_rss(contender, url, env, Path(scratch) / "idle.log"))
            contender.publish(url, IN_QUEUE, tasks)
            run, process = asyncio.run(_drain_and_probe(contender, url, env, tasks, round_trips))
            run.idle_rss_mb = idle_rss
            signalled = time.monotonic()
            run.exit_code = _stop(process, signal.SIGTERM)
            run.shutdown_s = time.monotonic() - signalled
            return run
    finally:
        rabbitmqctl("delete_vhost", vhost)
