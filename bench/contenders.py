"""The contenders: the raw loop, our worker in a few configurations, and the peers.

Every contender drains the same work (count the words of "the quick brown fox") as one worker
command, ``argv``, which may start more processes (``processes``; the bench sums the tree).
How each is timed:

- those that publish the protocol's reports (the baseline, ours, the FastStream subscriber),
  by a consumer of their reports;
- those that publish a result message (Celery's ``rpc://`` backend), by a consumer of those:
  the time each result became readable;
- the others append a line to a file per finished task (``bench/peers/_done.py``), and are
  timed by that file. Those with a result backend on Redis (Dramatiq's Results, taskiq-redis)
  append it once the result is stored, that is once a reader could get it.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika

from async_task_api_worker.client import build_envelope

__all__ = [
    "CONTENDERS",
    "IN_QUEUE",
    "OUT_QUEUE",
    "TEXT",
    "Contender",
    "available",
    "our_envelope",
    "publish_envelopes",
]

TEXT = "the quick brown fox"
IN_QUEUE, OUT_QUEUE = "bench_in", "bench_out"
"""The queues of every run (each run has a vhost of its own)."""
_RUN = [sys.executable, "-m", "async_task_api_worker", "run"]


def our_envelope(task_id: str) -> bytes:
    """The protocol's envelope for one task (what the AsyncTaskAPI publishes)."""
    return build_envelope({"text": TEXT}, service="bench", task_id=task_id, client_id="b")[1]


def _faststream_envelope(task_id: str) -> bytes:
    return json.dumps({"task_id": task_id, "input": {"text": TEXT}}).encode()


def publish_envelopes(envelope: Callable[[str], bytes]) -> Callable[[str, str, int], None]:
    """A ``publish(url, queue, count)`` that sends ``count`` envelopes, with confirms."""

    def publish(url: str, queue: str, count: int) -> None:
        asyncio.run(_publish(url, queue, count, envelope))

    return publish


async def _publish(url: str, queue: str, count: int, envelope: Callable[[str], bytes]) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue, durable=True)
        for start in range(0, count, 500):
            await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        aio_pika.Message(
                            envelope(f"t-{number}"),
                            content_type="application/json",
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        ),
                        routing_key=queue,
                    )
                    for number in range(start, min(count, start + 500))
                )
            )


def _peer_publish(module: str, **options: str) -> Callable[[str, str, int], None]:
    def publish(url: str, queue: str, count: int) -> None:
        importlib.import_module(module).publish(url, queue, count, **options)

    return publish


@dataclass(frozen=True)
class Contender:
    """One way to drain the queue.

    Attributes:
        key: a short name (``--only`` matches it, the charts use it).
        label: the table's name for it.
        argv: the command that starts the worker, from the repository's root.
        publish: ``publish(url, queue, count)`` puts ``count`` tasks on the input queue, in
            the contender's own envelope.
        envelope: for a contender that reports: the body of one task, given its id (the round
            trip publishes it); ``None`` for one that reports nothing.
        requires: the modules it needs (a peer is skipped when they are not installed).
        env: more environment for the worker.
        smoke: whether the smoke run (CI) includes it.
        processes: the worker processes it runs, each with a consumer on the input queue; the
            bench waits for that many consumers before it takes the idle RSS.
        results: it publishes one result message per task to ``OUT_QUEUE`` (Celery's
            ``rpc://`` backend), and is timed by them, as the reporting contenders are.
        skip_hint: when set, a worker that exits during start-up or never shows ``processes``
            consumers skips the contender (with this hint and the worker's last words) instead
            of failing the run: for a setting that this checkout may not know yet.
    """

    key: str
    label: str
    argv: list[str]
    publish: Callable[[str, str, int], None]
    envelope: Callable[[str], bytes] | None
    requires: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    smoke: bool = False
    processes: int = 1
    results: bool = False
    skip_hint: str | None = None

    @property
    def reports(self) -> bool:
        """Whether it publishes ``started`` and ``success`` reports (and can be timed by them)."""
        return self.envelope is not None

    @property
    def timed_on_out_queue(self) -> bool:
        """Whether the harness times it by the messages on ``OUT_QUEUE`` (else by its file)."""
        return self.reports or self.results


_OURS = publish_envelopes(our_envelope)
_BASELINE = [sys.executable, "-m", "bench.baseline"]
_NO_SUPERVISOR = (
    "WORKER_PROCESSES=2 needs the `run --processes N` supervisor, which this checkout's "
    "worker may not have yet"
)


def _ours(
    key: str,
    label: str,
    target: str,
    env: dict[str, str],
    *,
    smoke: bool = False,
    processes: int = 1,
) -> Contender:
    if processes > 1:
        env = {**env, "WORKER_PROCESSES": str(processes)}
    return Contender(
        key,
        label,
        [*_RUN, f"bench.trivial_worker:{target}"],
        _OURS,
        our_envelope,
        (),
        env,
        smoke,
        processes=processes,
        skip_hint=_NO_SUPERVISOR if processes > 1 else None,
    )


def _baseline(
    key: str, label: str, *words: str, prefetch: int = 1, processes: int = 1, smoke: bool = False
) -> Contender:
    argv = [*_BASELINE, *words, *(["--processes", str(processes)] if processes > 1 else [])]
    return Contender(
        key,
        label,
        argv,
        _OURS,
        our_envelope,
        ("uvloop",) if "uvloop" in words else (),
        {"PREFETCH": str(prefetch)} if prefetch != 1 else {},
        smoke,
        processes=processes,
    )


def _peer(
    key: str,
    label: str,
    module: str,
    variant: str,
    requires: tuple[str, ...],
    *,
    argv: list[str] | None = None,
    env: dict[str, str] | None = None,
    processes: int = 1,
    results: bool = False,
    publish: dict[str, str] | None = None,
) -> Contender:
    command = argv or [
        sys.executable,
        "-m",
        f"bench.peers.{module}",
        *([variant] if variant else []),
    ]
    return Contender(
        key,
        label,
        command,
        _peer_publish(f"bench.peers.{module}", **(publish or {})),
        None,
        requires,
        env or {},
        processes=processes,
        results=results,
    )


def _faststream(key: str, label: str, variant: str, processes: int = 1) -> Contender:
    if processes > 1:
        # ``faststream run --workers N``: its supervisor spawns N processes, each calling the
        # factory, which reads the variant from the environment.
        argv = [
            sys.executable,
            "-m",
            "faststream",
            "run",
            "bench.peers.faststream_worker:cli_app",
            "--factory",
            "--workers",
            str(processes),
        ]
        env = {"BENCH_PEER_VARIANT": variant}
    else:
        argv = [
            sys.executable,
            "-m",
            "bench.peers.faststream_worker",
            *([variant] if variant else []),
        ]
        env = {}
    return Contender(
        key,
        label,
        argv,
        _peer_publish("bench.peers.faststream_worker"),
        _faststream_envelope,
        ("faststream", "typer") if processes > 1 else ("faststream",),  # typer: its CLI
        env,
        processes=processes,
    )


def _dramatiq_cli(processes: int) -> list[str]:
    """``dramatiq --processes N --threads 8``, the broker set up by ``cli_setup``."""
    return [
        sys.executable,
        "-m",
        "dramatiq",
        "bench.peers.dramatiq_worker:cli_setup",
        "--processes",
        str(processes),
        "--threads",
        "8",
    ]


def _taskiq_cli(processes: int) -> list[str]:
    """``taskiq worker --workers N``, the broker built by ``cli_broker`` in each process."""
    return [
        sys.executable,
        "-m",
        "taskiq",
        "worker",
        "bench.peers.taskiq_worker:cli_broker",
        "--workers",
        str(processes),
        "--log-level",
        "WARNING",
    ]


_REDIS = ("redis",)
_CELERY_RPC = {"reply_to": OUT_QUEUE}

#: Another checkout of this repository (``BENCH_PREVIOUS``, its root): the ``previous-*``
#: contenders run our worker from its ``src``, beside this checkout's in the same run.
PREVIOUS = os.environ.get("BENCH_PREVIOUS", "")
_REPO = Path(__file__).resolve().parents[1]


def _previous(key: str, concurrency: int) -> Contender:
    contender = _ours(
        key,
        f"previous code ({Path(PREVIOUS).name or 'BENCH_PREVIOUS'}), async, "
        f"concurrency {concurrency}",
        "worker",
        {"WORKER_CONCURRENCY": str(concurrency)},
    )
    # Its src ahead of this checkout's editable install; bench.trivial_worker from here.
    contender.env["PYTHONPATH"] = f"{PREVIOUS}/src:{_REPO}"
    return contender


CONTENDERS = [
    # The raw loop: started and success overlap (one confirm round trip per task).
    _baseline("baseline", "baseline: raw aio-pika loop, prefetch 1", smoke=True),
    _baseline("baseline-uvloop", "baseline on uvloop", "uvloop"),
    _baseline("baseline-p8", "raw aio-pika loop, prefetch 8", prefetch=8),
    _baseline(
        "baseline-p8-uvloop", "raw aio-pika loop, prefetch 8, on uvloop", "uvloop", prefetch=8
    ),
    _baseline("baseline-p32", "raw aio-pika loop, prefetch 32", prefetch=32),
    _baseline(
        "baseline-p32-uvloop", "raw aio-pika loop, prefetch 32, on uvloop", "uvloop", prefetch=32
    ),
    # The old loop: it awaits started's confirm, then success's (two round trips per task).
    _baseline(
        "baseline-serial",
        "raw aio-pika loop, serial confirms (2 round trips), prefetch 1",
        "serial",
    ),
    _baseline(
        "baseline-serial-p8",
        "raw aio-pika loop, serial confirms (2 round trips), prefetch 8",
        "serial",
        prefetch=8,
    ),
    _baseline(
        "baseline-p8-uvloop-x2",
        "raw aio-pika loop, prefetch 8, on uvloop, 2 processes",
        "uvloop",
        prefetch=8,
        processes=2,
    ),
    _baseline(
        "baseline-p32-uvloop-x2",
        "raw aio-pika loop, prefetch 32, on uvloop, 2 processes",
        "uvloop",
        prefetch=32,
        processes=2,
    ),
    _ours("ours-c1", "ours, async, concurrency 1", "worker", {}, smoke=True),
    _ours("ours-c8", "ours, async, concurrency 8", "worker", {"WORKER_CONCURRENCY": "8"}),
    _ours(
        "ours-c8-info",
        "ours, async, concurrency 8, INFO logs (a JSON line per task)",
        "worker",
        {"WORKER_CONCURRENCY": "8", "LOG_LEVEL": "INFO"},
    ),
    _ours(
        "ours-c8-asyncio",
        "ours, async, concurrency 8, asyncio loop",
        "worker",
        {"WORKER_CONCURRENCY": "8", "WORKER_EVENT_LOOP": "asyncio"},
    ),
    _ours(
        "ours-c32",
        "ours, async, concurrency 32",
        "worker",
        {"WORKER_CONCURRENCY": "32"},
    ),
    _previous("previous-c1", 1),
    _previous("previous-c32", 32),
    _ours(
        "ours-def-c8",
        "ours, def, concurrency 8",
        "sync_worker",
        {"WORKER_CONCURRENCY": "8"},
    ),
    _ours(
        "ours-process-c2",
        "ours, process isolation, concurrency 2",
        "isolated_worker",
        {"WORKER_CONCURRENCY": "2"},
    ),
    _ours(
        "ours-c8-p2",
        "ours, async, concurrency 8, 2 processes (WORKER_PROCESSES=2)",
        "worker",
        {"WORKER_CONCURRENCY": "8"},
        processes=2,
    ),
    _ours(
        "ours-c32-p2",
        "ours, async, concurrency 32, 2 processes (WORKER_PROCESSES=2)",
        "worker",
        {"WORKER_CONCURRENCY": "32"},
        processes=2,
    ),
    _faststream(
        "faststream", "FastStream, started + success reports, no prefetch limit (its default)", ""
    ),
    _faststream("faststream-p8", "FastStream, started + success reports, prefetch 8", "prefetch8"),
    _faststream(
        "faststream-p32", "FastStream, started + success reports, prefetch 32", "prefetch32"
    ),
    _faststream(
        "faststream-p8-x2",
        "FastStream, started + success reports, prefetch 8, --workers 2",
        "prefetch8",
        processes=2,
    ),
    _faststream(
        "faststream-p32-x2",
        "FastStream, started + success reports, prefetch 32, --workers 2",
        "prefetch32",
        processes=2,
    ),
    _peer(
        "celery-prefork",
        "Celery, acks late, prefork x2 (3 processes), no report",
        "celery_worker",
        "prefork",
        ("celery",),
    ),
    _peer(
        "celery-threads",
        "Celery, acks late, threads x8, no report",
        "celery_worker",
        "threads",
        ("celery",),
    ),
    _peer(
        "celery-rpc-threads",
        "Celery, acks late, threads x8, rpc:// result",
        "celery_worker",
        "rpc-threads",
        ("celery",),
        results=True,
        publish=_CELERY_RPC,
    ),
    _peer(
        "celery-rpc-prefork",
        "Celery, acks late, prefork x2 (3 processes), rpc:// result",
        "celery_worker",
        "rpc-prefork",
        ("celery",),
        results=True,
        publish=_CELERY_RPC,
    ),
    _peer("dramatiq", "Dramatiq, 8 threads, no report", "dramatiq_worker", "", ("dramatiq",)),
    _peer(
        "dramatiq-results",
        "Dramatiq, 8 threads, Results on Redis",
        "dramatiq_worker",
        "results",
        ("dramatiq", *_REDIS),
    ),
    _peer(
        "dramatiq-x2",
        "Dramatiq CLI, --processes 2 x 8 threads, no report",
        "dramatiq_worker",
        "",
        ("dramatiq",),
        argv=_dramatiq_cli(2),
        processes=2,
    ),
    _peer(
        "dramatiq-results-x2",
        "Dramatiq CLI, --processes 2 x 8 threads, Results on Redis",
        "dramatiq_worker",
        "results",
        ("dramatiq", *_REDIS),
        argv=_dramatiq_cli(2),
        env={"BENCH_PEER_VARIANT": "results"},
        processes=2,
    ),
    _peer(
        "taskiq", "taskiq (aio-pika broker), no report", "taskiq_worker", "", ("taskiq_aio_pika",)
    ),
    _peer(
        "taskiq-redis",
        "taskiq (aio-pika broker), Redis result backend",
        "taskiq_worker",
        "redis",
        ("taskiq_aio_pika", "taskiq_redis"),
    ),
    _peer(
        "taskiq-x2",
        "taskiq worker --workers 2, no report",
        "taskiq_worker",
        "",
        ("taskiq_aio_pika",),
        argv=_taskiq_cli(2),
        processes=2,
    ),
    _peer(
        "taskiq-redis-x2",
        "taskiq worker --workers 2, Redis result backend",
        "taskiq_worker",
        "redis",
        ("taskiq_aio_pika", "taskiq_redis"),
        argv=_taskiq_cli(2),
        env={"BENCH_PEER_VARIANT": "redis"},
        processes=2,
    ),
]


def available(contender: Contender) -> bool:
    """Whether what the contender needs is installed (``uv sync --group bench`` for peers).

    The ``previous-*`` contenders need ``BENCH_PREVIOUS`` (another checkout's root).
    """
    if contender.key.startswith("previous-") and not PREVIOUS:
        return False
    return all(importlib.util.find_spec(name) is not None for name in contender.requires)
