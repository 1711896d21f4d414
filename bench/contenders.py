"""The contenders: the raw loop, our worker in a few configurations, and the peers.

Every contender drains the same work (count the words of "the quick brown fox") as one worker
started with ``argv``. Those that publish the protocol's reports (the baseline, ours, the
FastStream subscriber) are timed by their reports; the peers that report nothing append a line
to a file per finished task (``bench/peers/_done.py``) and are timed by that file.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import aio_pika

from async_task_api_worker.client import build_envelope

__all__ = ["CONTENDERS", "TEXT", "Contender", "available", "our_envelope"]

TEXT = "the quick brown fox"
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


def _peer_publish(module: str) -> Callable[[str, str, int], None]:
    def publish(url: str, queue: str, count: int) -> None:
        importlib.import_module(module).publish(url, queue, count)

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
    """

    key: str
    label: str
    argv: list[str]
    publish: Callable[[str, str, int], None]
    envelope: Callable[[str], bytes] | None
    requires: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    smoke: bool = False

    @property
    def reports(self) -> bool:
        """Whether it publishes ``started`` and ``success`` reports (and can be timed by them)."""
        return self.envelope is not None


_OURS = publish_envelopes(our_envelope)


def _ours(key: str, label: str, target: str, env: dict[str, str], smoke: bool = False) -> Contender:
    return Contender(
        key, label, [*_RUN, f"bench.trivial_worker:{target}"], _OURS, our_envelope, (), env, smoke
    )


def _peer(key: str, label: str, module: str, variant: str, requires: str) -> Contender:
    argv = [sys.executable, "-m", f"bench.peers.{module}", *([variant] if variant else [])]
    return Contender(key, label, argv, _peer_publish(f"bench.peers.{module}"), None, (requires,))


CONTENDERS = [
    Contender(
        "baseline",
        "baseline: raw aio-pika loop, prefetch 1",
        [sys.executable, "-m", "bench.baseline"],
        _OURS,
        our_envelope,
        smoke=True,
    ),
    Contender(
        "baseline-uvloop",
        "baseline on uvloop",
        [sys.executable, "-m", "bench.baseline", "uvloop"],
        _OURS,
        our_envelope,
        ("uvloop",),
    ),
    Contender(
        "baseline-p8",
        "raw aio-pika loop, prefetch 8 (confirms overlap)",
        [sys.executable, "-m", "bench.baseline"],
        _OURS,
        our_envelope,
        env={"PREFETCH": "8"},
    ),
    Contender(
        "baseline-p8-uvloop",
        "raw aio-pika loop, prefetch 8, on uvloop",
        [sys.executable, "-m", "bench.baseline", "uvloop"],
        _OURS,
        our_envelope,
        ("uvloop",),
        env={"PREFETCH": "8"},
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
    Contender(
        "faststream",
        "FastStream, started + success reports, no prefetch limit (its default)",
        [sys.executable, "-m", "bench.peers.faststream_worker"],
        _peer_publish("bench.peers.faststream_worker"),
        _faststream_envelope,
        ("faststream",),
    ),
    Contender(
        "faststream-p8",
        "FastStream, started + success reports, prefetch 8",
        [sys.executable, "-m", "bench.peers.faststream_worker", "prefetch8"],
        _peer_publish("bench.peers.faststream_worker"),
        _faststream_envelope,
        ("faststream",),
    ),
    Contender(
        "faststream-p32",
        "FastStream, started + success reports, prefetch 32",
        [sys.executable, "-m", "bench.peers.faststream_worker", "prefetch32"],
        _peer_publish("bench.peers.faststream_worker"),
        _faststream_envelope,
        ("faststream",),
    ),
    _peer(
        "celery-prefork",
        "Celery, acks late, prefork x2 (3 processes), no report",
        "celery_worker",
        "prefork",
        "celery",
    ),
    _peer(
        "celery-threads",
        "Celery, acks late, threads x8, no report",
        "celery_worker",
        "threads",
        "celery",
    ),
    _peer("dramatiq", "Dramatiq, 8 threads, no report", "dramatiq_worker", "", "dramatiq"),
    _peer("taskiq", "taskiq (aio-pika broker), no report", "taskiq_worker", "", "taskiq_aio_pika"),
]


def available(contender: Contender) -> bool:
    """Whether what the contender needs is installed (``uv sync --group bench`` for peers)."""
    return all(importlib.util.find_spec(name) is not None for name in contender.requires)
