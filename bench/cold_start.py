"""Cold start of a one-shot job: one task already queued, then exec, the task, the exit.

A KEDA ScaledJob starts a pod per message: the worker process is started with one task
waiting, does it, and exits. Run from the repository's root (RabbitMQ on 127.0.0.1:5672,
``rabbitmqctl`` usable; the peers need ``uv sync --group bench``)::

    uv run --group bench python -m bench.cold_start            # 10 runs each, + import times
    uv run python -m bench.cold_start --only ours-job,baseline-once --runs 5

For each contender, in a vhost of its own (the queues exist from a first run, which is not
counted, as the platform's queues exist before a job starts), and for each run: one task is
published, then the clock starts and the worker is exec'd (``subprocess.Popen``). The figures:

- **to start**: to the task's start. For the contenders that publish reports (ours, the raw
  loop, FastStream), the arrival of its ``started`` report at the bench's consumer; for the
  others, the ``time.monotonic()`` that the task itself writes when it starts
  (``bench.peers._done.mark_start``), a little earlier than a report would arrive.
- **to exit**: to the process's exit. Ours in job mode (``WORKER_MODE=job``,
  ``WORKER_JOB_MAX_DELIVERIES=1``), the raw loop's ``once`` and taskiq's receiver with
  ``max_tasks_to_execute=1`` exit by themselves after the task. Celery, Dramatiq and
  FastStream have no such mode: the bench sends SIGTERM as soon as it sees the task done (its
  ``success`` report, or its completion line), and **SIGTERM to exit** is quoted apart.

Median and p90 over the runs (``--runs``, 10 by default). Then, unless ``--no-importtime``,
the top imports of ``python -X importtime -m async_task_api_worker run bench.trivial_worker:
worker`` in job mode with one task queued, by cumulative time and by their own time, to show
what to load lazily.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from bench.contenders import (
    IN_QUEUE,
    OUT_QUEUE,
    _peer_publish,
    our_envelope,
    publish_envelopes,
)
from bench.measure import BROKER_URL, REDIS_URL, REPO, _vhost_url, kill_tree, rabbitmqctl

_PHASE_TIMEOUT_S = 60.0
_POLL_S = 0.002
_OURS_ARGV = [sys.executable, "-m", "async_task_api_worker", "run", "bench.trivial_worker:worker"]
_JOB_ENV = {"WORKER_MODE": "job", "WORKER_JOB_MAX_DELIVERIES": "1"}


@dataclass(frozen=True)
class OneShot:
    """One way to run a single queued task in a fresh process.

    Attributes:
        key: the name ``--only`` matches.
        label: the table's name for it.
        argv: the worker's command, from the repository's root.
        publish: ``publish(url, queue, count)`` in the contender's own envelope.
        reports: it publishes ``started`` and ``success`` reports (else it writes the
            start and completion lines of ``bench.peers._done``).
        exits: it exits by itself after the task (else SIGTERM once the task is done).
        requires: the modules it needs (skipped when they are not installed).
        env: more environment for the worker.
    """

    key: str
    label: str
    argv: list[str]
    publish: Callable[[str, str, int], None]
    reports: bool
    exits: bool
    requires: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def _peer(module: str, *variant: str) -> list[str]:
    return [sys.executable, "-m", f"bench.peers.{module}", *variant]


SHOTS = [
    OneShot(
        "ours-job",
        "ours, job mode (WORKER_MODE=job, WORKER_JOB_MAX_DELIVERIES=1)",
        _OURS_ARGV,
        publish_envelopes(our_envelope),
        reports=True,
        exits=True,
        env=_JOB_ENV,
    ),
    OneShot(
        "baseline-once",
        "raw aio-pika loop, once (asyncio loop): exit after the first task",
        [sys.executable, "-m", "bench.baseline", "once"],
        publish_envelopes(our_envelope),
        reports=True,
        exits=True,
    ),
    OneShot(
        "faststream",
        "FastStream, prefetch 8, SIGTERM once done",
        _peer("faststream_worker", "prefetch8"),
        _peer_publish("bench.peers.faststream_worker"),
        reports=True,
        exits=False,
        requires=("faststream",),
    ),
    OneShot(
        "celery-solo",
        "Celery, solo pool, acks late, SIGTERM once done",
        _peer("celery_worker", "solo"),
        _peer_publish("bench.peers.celery_worker"),
        reports=False,
        exits=False,
        requires=("celery",),
    ),
    OneShot(
        "dramatiq",
        "Dramatiq, 8 threads, SIGTERM once done",
        _peer("dramatiq_worker"),
        _peer_publish("bench.peers.dramatiq_worker"),
        reports=False,
        exits=False,
        requires=("dramatiq",),
    ),
    OneShot(
        "taskiq-once",
        "taskiq receiver, max_tasks_to_execute=1",
        _peer("taskiq_worker", "once"),
        _peer_publish("bench.peers.taskiq_worker"),
        reports=False,
        exits=True,
        requires=("taskiq_aio_pika",),
    ),
]


@dataclass
class Sample:
    """One run's times from exec, in seconds."""

    to_start_s: float
    to_done_s: float
    to_exit_s: float
    sigterm_to_exit_s: float | None
    exit_code: int


class _Exit:
    """Records when the process exits, from a thread blocked in ``waitpid``."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.at: float | None = None
        self.code: int | None = None
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        code = self.process.wait()
        self.at = time.monotonic()
        self.code = code


class _Reports:
    """The first ``started`` and the first terminal report of the current run."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.done: float | None = None

    def reset(self) -> None:
        self.started = self.done = None

    async def on_report(self, message: AbstractIncomingMessage) -> None:
        now = time.monotonic()
        if message.type == "started" and self.started is None:
            self.started = now
        elif message.type in ("success", "failure") and self.done is None:
            self.done = now


def _first_mark(path: Path) -> float | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    lines = text.split()
    return float(lines[0]) if lines else None


async def _until(what: str, probe: Callable[[], float | None], exited: _Exit | None) -> float:
    deadline = time.monotonic() + _PHASE_TIMEOUT_S
    while (value := probe()) is None:
        if exited is not None and exited.at is not None:
            raise RuntimeError(f"the worker exited with {exited.code} before {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {_PHASE_TIMEOUT_S:.0f} s")
        await asyncio.sleep(_POLL_S)
    return value


async def _one(shot: OneShot, env: dict[str, str], reports: _Reports, scratch: Path) -> Sample:
    start_file, done_file, log = scratch / "start", scratch / "done", scratch / "worker.log"
    for path in (start_file, done_file):
        path.unlink(missing_ok=True)
    env = {**env, "BENCH_START_FILE": str(start_file), "BENCH_DONE_FILE": str(done_file)}
    reports.reset()
    with log.open("wb") as stderr:
        began = time.monotonic()
        process = subprocess.Popen(  # noqa: S603, ASYNC220 - our own command
            shot.argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr
        )
    exited = _Exit(process)
    try:
        if shot.reports:
            started = await _until("a started report", lambda: reports.started, exited)
            done = await _until("a terminal report", lambda: reports.done, exited)
        else:
            started = await _until("the task's start", lambda: _first_mark(start_file), exited)
            done = await _until("the task's end", lambda: _first_mark(done_file), exited)
        signalled: float | None = None
        if not shot.exits:
            signalled = time.monotonic()
            process.terminate()
        exit_at = await _until("the exit", lambda: exited.at, None)
    except BaseException as exc:
        kill_tree(process)
        words = log.read_text(errors="replace").strip().splitlines()[-3:]
        if isinstance(exc, Exception):
            raise RuntimeError(f"{shot.key}: {exc}; the worker said: {words}") from exc
        raise
    return Sample(
        to_start_s=started - began,
        to_done_s=done - began,
        to_exit_s=exit_at - began,
        sigterm_to_exit_s=None if signalled is None else exit_at - signalled,
        exit_code=exited.code if exited.code is not None else -1,
    )


@contextlib.contextmanager
def _vhost(queue_type: str) -> Iterator[str]:
    vhost = f"cold-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", vhost, "--default-queue-type", queue_type)
    user = urllib.parse.unquote(urllib.parse.urlsplit(BROKER_URL).username or "guest")
    rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
    try:
        yield vhost
    finally:
        rabbitmqctl("delete_vhost", vhost)


async def _shots(shot: OneShot, url: str, env: dict[str, str], runs: int) -> list[Sample]:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        out = await channel.declare_queue(OUT_QUEUE, durable=True)
        reports = _Reports()
        await out.consume(reports.on_report, no_ack=True)
        samples = []
        with tempfile.TemporaryDirectory(prefix="cold-") as scratch:
            for number in range(runs + 1):  # the first makes the queues, and is not kept
                await asyncio.to_thread(shot.publish, url, IN_QUEUE, 1)
                sample = await _one(shot, env, reports, Path(scratch))
                if number:
                    samples.append(sample)
                print(
                    f"# {shot.key} run {number}{' (warm-up)' if not number else ''}: "
                    f"start {sample.to_start_s * 1000:.0f} ms, exit {sample.to_exit_s * 1000:.0f} "
                    f"ms, exit code {sample.exit_code}",
                    file=sys.stderr,
                    flush=True,
                )
                await asyncio.sleep(0.2)  # let the broker settle the last connection's close
        return samples


def _env(url: str, vhost: str, queue_type: str) -> dict[str, str]:
    return {
        **os.environ,
        "BROKER_URL": url,
        "IN_QUEUE_NAME": IN_QUEUE,
        "OUT_QUEUE_NAME": OUT_QUEUE,
        "HEALTH_CHECK_PORT": "0",
        "LOG_LEVEL": "WARNING",
        "BENCH_QUEUE_TYPE": queue_type,
        "BENCH_REDIS_URL": REDIS_URL,
        "BENCH_RUN_ID": vhost,
    }


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _ms(values: list[float]) -> str:
    return f"{_percentile(values, 0.5) * 1000:,.0f} | {_percentile(values, 0.9) * 1000:,.0f}"


def table(rows: list[tuple[OneShot, list[Sample]]], runs: int) -> list[str]:
    """The Markdown table: median and p90 of each figure, in ms."""
    lines = [
        f"| one-shot run ({runs} runs) | to start p50 ms | p90 | to exit p50 ms | p90 "
        "| of which SIGTERM to exit p50 ms | exit |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for shot, samples in rows:
        sigterm = [s.sigterm_to_exit_s for s in samples if s.sigterm_to_exit_s is not None]
        lines.append(
            f"| {shot.label} | {_ms([s.to_start_s for s in samples])} "
            f"| {_ms([s.to_exit_s for s in samples])} "
            f"| {f'{_percentile(sigterm, 0.5) * 1000:,.0f}' if sigterm else '-'} "
            f"| {','.join(sorted({str(s.exit_code) for s in samples}))} |"
        )
    return lines


_IMPORT_LINE = re.compile(r"^import time:\s+(\d+)\s+\|\s+(\d+)\s+\|(\s*)(\S+)")


def import_times(queue_type: str, top: int) -> list[str]:
    """The ``top`` imports by cumulative time of ours in job mode, one task queued."""
    with _vhost(queue_type) as vhost:
        url = _vhost_url(vhost)
        publish_envelopes(our_envelope)(url, IN_QUEUE, 1)
        done = subprocess.run(  # noqa: S603 - our own command
            [sys.executable, "-X", "importtime", *_OURS_ARGV[1:]],
            cwd=REPO,
            env={**_env(url, vhost, queue_type), **_JOB_ENV},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    found = []
    for line in done.stderr.splitlines():
        if match := _IMPORT_LINE.match(line):
            own, cumulative, indent, name = match.groups()
            found.append((int(cumulative), int(own), (len(indent) - 1) // 2, name))
    total = sum(cumulative for cumulative, _own, depth, _name in found if depth == 0)
    lines = [
        f"# python -X importtime -m async_task_api_worker run bench.trivial_worker:worker "
        f"(job mode, one task; exit {done.returncode}): {len(found)} imports, "
        f"{total / 1000:.0f} ms in all (top-level cumulative sum)",
    ]
    by_self = sorted(found, key=lambda row: row[1], reverse=True)
    for title, ordered in (("cumulative time", sorted(found, reverse=True)), ("self", by_self)):
        lines += [
            f"# top {top} by {title}; depth 0 is a top-level import",
            f"{'cumulative ms':>14}{'self ms':>9}{'depth':>7}  module",
        ]
        for cumulative, own, depth, name in ordered[:top]:
            lines.append(f"{cumulative / 1000:>14.1f}{own / 1000:>9.1f}{depth:>7}  {name}")
    return lines


def main() -> None:
    """Run the one-shot contenders, print the table, then the import times."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.cold_start", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--runs", type=int, default=10, help="runs per contender (one warm-up)")
    parser.add_argument("--only", default="", help=f"some of: {','.join(s.key for s in SHOTS)}")
    parser.add_argument("--queue-type", choices=["classic", "quorum"], default="classic")
    parser.add_argument("--importtime-top", type=int, default=15, help="imports listed")
    parser.add_argument("--no-importtime", action="store_true", help="skip the import times")
    arguments = parser.parse_args()
    wanted = [key for key in arguments.only.split(",") if key]
    unknown = sorted(set(wanted) - {s.key for s in SHOTS})
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}; known: {', '.join(s.key for s in SHOTS)}")
    shots = [s for s in SHOTS if not wanted or s.key in wanted]
    missing = [s.key for s in shots if any(importlib.util.find_spec(m) is None for m in s.requires)]
    shots = [s for s in shots if s.key not in missing]
    print(
        f"# cold start of a one-shot job, {arguments.queue_type} queues; "
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"{time.strftime('%Y-%m-%d')}"
    )
    if missing:
        print(f"# skipped (not installed: uv sync --group bench): {', '.join(missing)}")
    rows = []
    for shot in shots:
        with _vhost(arguments.queue_type) as vhost:
            url = _vhost_url(vhost)
            env = {**_env(url, vhost, arguments.queue_type), **shot.env}
            rows.append((shot, asyncio.run(_shots(shot, url, env, arguments.runs))))
    print("\n".join(table(rows, arguments.runs)), flush=True)
    if not arguments.no_importtime:
        print()
        print("\n".join(import_times(arguments.queue_type, arguments.importtime_top)))


if __name__ == "__main__":
    main()
