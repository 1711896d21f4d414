"""``await worker.serve()`` in the caller's event loop, on the real broker."""

from __future__ import annotations

import asyncio

import pytest

from async_task_api_worker.errors import BrokerRefusedError
from examples.count_words import worker
from tests.integration.conftest import Queues, broker_url
from tests.integration.test_channel_failures import transport_says
from tests.integration.test_run_on_rabbitmq import collect


async def test_serve_works_in_the_callers_loop_and_drains_when_cancelled(
    queues: Queues, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in queues.env().items():
        monkeypatch.setenv(name, value)
    with transport_says("Connected to") as connected:
        serving = asyncio.create_task(worker.serve())
        # Its queues declared before the client declares them too: a loaded node's quorum
        # queue, declared by both at once, can close the client's connection (INTERNAL_ERROR).
        await asyncio.wait_for(connected.reach(1), timeout=30)
    async with queues.client("count-words") as client:
        task_id = await client.submit({"text": "in process"})
        reports = await collect(client, task_id)
    assert [r.type for r in reports] == ["started", "progress", "success"]
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving
    queues.assert_drained(queues.in_queue)


async def test_serve_raises_when_the_broker_refuses(
    queues: Queues, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = queues.env(BROKER_URL=broker_url(queues.vhost, password="wrong"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(BrokerRefusedError, match="refused the credentials"):
        await worker.serve()
