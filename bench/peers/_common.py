"""What the peers share: the workload, the environment they read, logging."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Coroutine
from typing import Any

import aio_pika

from bench.loops import run

TEXT = "the quick brown fox"
"""Every task's input."""


def count_words(text: str) -> int:
    """The work of every task."""
    return len(text.split())


def env(name: str) -> str:
    """A required environment variable."""
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"{name} is not set")
    return value


def serve(main: Coroutine[Any, Any, None]) -> None:
    """Run a peer's asyncio worker on the loop its own CLI would pick: uvloop when installed.

    ``faststream run`` and ``taskiq worker`` both switch to uvloop when it is importable, as
    our worker does (``WORKER_EVENT_LOOP=auto``), so the comparison is loop for loop.
    """
    run(main, uvloop=None)


def log_level() -> int:
    """``LOG_LEVEL`` (as the benchmark gives our worker), WARNING by default."""
    name = os.environ.get("LOG_LEVEL", "WARNING").upper()
    return logging.getLevelNamesMapping().get(name, logging.WARNING)


async def vhost_queue_type(url: str) -> str:
    """The queue type that the vhost of ``url`` gives a queue declared without ``x-queue-type``.

    ``BENCH_QUEUE_TYPE`` (``classic`` or ``quorum``) when set; otherwise asked of the broker:
    declare a durable probe queue without arguments, then again with ``x-queue-type: quorum``;
    RabbitMQ accepts the second declaration only if the first made a quorum queue (it refuses an
    inequivalent ``x-queue-type`` with ``PRECONDITION_FAILED``). The probe is deleted (and
    expires after a minute anyway).

    RabbitMQ applies a vhost's default queue type only to declarations without
    ``x-queue-type``. The peers that always send one (FastStream: classic, taskiq-aio-pika:
    quorum) or must know the type (Celery: it uses global QoS, which quorum queues refuse,
    unless told its queue is quorum) ask here, so that every contender gets the vhost's type.
    """
    forced = os.environ.get("BENCH_QUEUE_TYPE", "").lower()
    if forced:
        if forced not in ("classic", "quorum"):
            raise SystemExit(f"BENCH_QUEUE_TYPE must be classic or quorum, not {forced!r}")
        return forced
    probe = f"bench.peers.queue-type-probe.{uuid.uuid4().hex}"
    expires: dict[str, Any] = {"x-expires": 60_000}
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(probe, durable=True, arguments=expires)
        try:
            quorum = await connection.channel()
            await quorum.declare_queue(
                probe, durable=True, arguments={**expires, "x-queue-type": "quorum"}
            )
        except aio_pika.exceptions.ChannelPreconditionFailed:
            kind = "classic"
        else:
            kind = "quorum"
        await channel.queue_delete(probe)
    return kind


def queue_type(url: str) -> str:
    """:func:`vhost_queue_type`, from synchronous code."""
    return asyncio.run(vhost_queue_type(url))
