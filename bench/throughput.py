"""Throughput, memory and shutdown of one worker process per contender, on the local RabbitMQ.

Run from the repository's root (RabbitMQ on 127.0.0.1:5672, ``rabbitmqctl`` usable)::

    uv run python -m bench.throughput                 # 10,000 tasks, 3 runs each
    uv run python -m bench.throughput --smoke         # 50 tasks, 1 run: checks it still works

For each contender and run: a fresh quorum vhost; N envelopes published before the worker
starts; the worker started as one OS process; the time from its first ``started`` report to
its N-th terminal report (start-up excluded); its peak RSS (``VmHWM``); the time from SIGTERM to
its exit. The table gives medians and each contender's throughput as a ratio to the baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import aio_pika

from async_task_api_worker._version import __version__
from async_task_api_worker.client import build_envelope

REPO = Path(__file__).resolve().parents[1]
RUN = [sys.executable, "-m", "async_task_api_worker", "run"]


@dataclass(frozen=True)
class Contender:
    """One way to drain the queue."""

    name: str
    argv: list[str]
    env: dict[str, str]


CONTENDERS = [
    Contender("baseline (raw aio-pika)", [sys.executable, "-m", "bench.baseline"], {}),
    Contender("ours, async, concurrency 1", [*RUN, "bench.trivial_worker:worker"], {}),
    Contender(
        "ours, async, concurrency 8",
        [*RUN, "bench.trivial_worker:worker"],
        {"WORKER_CONCURRENCY": "8"},
    ),
    Contender(
        "ours, def, concurrency 8",
        [*RUN, "bench.trivial_worker:sync_worker"],
        {"WORKER_CONCURRENCY": "8"},
    ),
    Contender(
        "ours, process isolation, concurrency 2",
        [*RUN, "bench.trivial_worker:isolated_worker"],
        {"WORKER_CONCURRENCY": "2"},
    ),
]


def rabbitmqctl(*arguments: str) -> None:
    """Run ``rabbitmqctl`` (vhosts for each run)."""
    subprocess.run(["rabbitmqctl", *arguments], check=True, capture_output=True)  # noqa: S603, S607


@dataclass
class Run:
    """One run's figures."""

    tasks_per_s: float
    peak_rss_mb: float
    shutdown_s: float


async def _publish(url: str, queue: str, count: int) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue, durable=True)
        batch = []
        for number in range(count):
            _, body = build_envelope(
                {"text": "the quick brown fox"},
                service="bench",
                task_id=f"t-{number}",
                client_id="b",
            )
            batch.append(
                channel.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=queue,
                )
            )
            if len(batch) == 500:
                await asyncio.gather(*batch)
                batch = []
        await asyncio.gather(*batch)


async def _count_reports(url: str, queue: str, count: int, timeout_s: float) -> tuple[float, float]:
    """Times of the first ``started`` and of the ``count``-th terminal report."""
    connection = await aio_pika.connect(url)
    first: float | None = None
    terminal = 0
    done = asyncio.get_running_loop().create_future()
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1000)
        out = await channel.declare_queue(queue, durable=True)

        async def on_report(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal first, terminal
            kind = message.type or json.loads(message.body).get("type")
            if first is None:
                first = time.perf_counter()
            if kind in ("success", "failure"):
                terminal += 1
                if terminal == count and not done.done():
                    done.set_result(time.perf_counter())
            await message.ack()

        await out.consume(on_report)
        last = await asyncio.wait_for(done, timeout_s)
    if first is None:
        raise RuntimeError("no report came")
    return first, last


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one_run(contender: Contender, tasks: int) -> Run:
    """Drain ``tasks`` with ``contender`` once, in a vhost of its own."""
    vhost = f"bench-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", vhost, "--default-queue-type", "quorum")
    rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    try:
        url = f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
        env = {
            **os.environ,
            "BROKER_URL": url,
            "IN_QUEUE_NAME": "bench_in",
            "OUT_QUEUE_NAME": "bench_out",
            "HEALTH_CHECK_PORT": "0",
            "LOG_LEVEL": "WARNING",
            **contender.env,
        }
        asyncio.run(_publish(url, "bench_in", tasks))

        async def measure() -> tuple[float, float, subprocess.Popen[bytes]]:
            counting = asyncio.ensure_future(
                _count_reports(url, "bench_out", tasks, timeout_s=60 + tasks / 20)
            )
            await asyncio.sleep(0.2)  # the counter is consuming before the worker starts
            process = subprocess.Popen(  # noqa: S603, ASYNC220 - our own commands, started once
                contender.argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL
            )
            first, last = await counting
            return first, last, process

        first, last, process = asyncio.run(measure())
        peak = _peak_rss_mb(process.pid)
        signalled = time.perf_counter()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        shutdown = time.perf_counter() - signalled
        return Run(tasks / (last - first), peak, shutdown)
    finally:
        rabbitmqctl("delete_vhost", vhost)


def main() -> None:
    """Run every contender, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="50 tasks, 1 run, no isolation")
    parser.add_argument("--only", default="", help="run the contenders whose name contains this")
    arguments = parser.parse_args()
    tasks, runs = (50, 1) if arguments.smoke else (arguments.tasks, arguments.runs)
    contenders = [c for c in CONTENDERS if arguments.only in c.name]
    if arguments.smoke:
        contenders = contenders[:2]
    print(f"# {tasks} tasks drained per run, {runs} run(s) per contender, medians")
    print(
        f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"async-task-api-worker {__version__}, {time.strftime('%Y-%m-%d')}"
    )
    print(f"{'contender':<42}{'tasks/s':>10}{'x base':>8}{'peak RSS MB':>13}{'SIGTERM s':>11}")
    baseline: float | None = None
    for contender in contenders:
        results = [one_run(contender, tasks) for _ in range(runs)]
        rate = statistics.median(r.tasks_per_s for r in results)
        baseline = baseline or rate
        print(
            f"{contender.name:<42}{rate:>10.0f}{rate / baseline:>8.2f}"
            f"{statistics.median(r.peak_rss_mb for r in results):>13.1f}"
            f"{statistics.median(r.shutdown_s for r in results):>11.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
