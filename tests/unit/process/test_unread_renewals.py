"""Renewals nobody in the group reads fill the channel's socket; the lease still holds.

A handler that kills its own child processes kills the lease's watchdog too: the task runs on
unfenced (docs/isolation.md) and nothing reads the worker's renewals. Sent on the socket with
``MSG_DONTWAIT`` (not queued on the stream), they fill its buffer (278 one-byte renewals with
Linux's default 208 KiB); a renewal that then could not be sent must not count as one the
worker failed to send: the worker did not freeze, so its own side of the lease must not lapse
and void a run that is still held.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from async_task_api_worker.ports import Outcome
from async_task_api_worker.transports.memory import InMemoryTransport
from tests.polling import until
from tests.unit.process.test_lease import two_second_lease
from tests.unit.process.test_process_executor import task_body

#: The socket's send buffer (the kernel's least): a few renewals fill it.
SNDBUF = 1024
#: The handler's sleep once unfenced: several expiries, renewals every eighth of one.
RUN_S = 6.0


async def test_renewals_that_fill_an_unread_channel_do_not_lapse_a_held_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    socketpair = socket.socketpair

    def small_buffers(*args: object) -> tuple[socket.socket, socket.socket]:
        pair = socketpair(*args)  # type: ignore[arg-type]
        for end in pair:
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
        return pair

    monkeypatch.setattr(socket, "socketpair", small_buffers)
    marker = tmp_path / "unfenced"
    transport = InMemoryTransport()
    observed, runner = two_second_lease(transport)
    serving = asyncio.create_task(runner.serve())
    try:
        transport.put(
            task_body("t-unfenced", {"mode": "unfenced", "marker": str(marker), "data": RUN_S})
        )
        await until(marker.exists, 30, "the run, unfenced")
        await asyncio.wait_for(observed.settled.wait(), 30)
    finally:
        runner.request_shutdown("test")
        await serving
    (settled,) = observed.settlements
    assert (settled.outcome, settled.reason) == (Outcome.SUCCESS, None), settled
    assert [p.report.type for p in transport.published] == ["started", "success"]
