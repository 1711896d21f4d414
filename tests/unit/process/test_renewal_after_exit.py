"""A lease renewal that meets a task process already gone loses none of its answer.

The renewal used to go through the channel's stream: written to a child that had answered and
exited, it broke the pipe, the stream closed, and the answer still unread in the socket was
lost: a success reported as ``INVALID_RESULT`` ("exited (code 0) without a result"), seen in
CI's freeze storms.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from async_task_api_worker.executors.process.lease import Grant
from async_task_api_worker.testing import WorkerHarness
from tests.polling import wait_for
from tests.unit.process.workers import isolated

#: How long the worker's loop stays frozen once the child has its request: the child answers
#: and exits meanwhile (a quick handler: milliseconds).
FREEZE_S = 1.0


async def test_a_renewal_after_the_child_answered_and_exited_keeps_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "request-reached-the-child"
    renewed: list[BaseException | None] = []
    start = Grant.start

    def freeze_then_renew(renew: Callable[[], None]) -> None:
        # The loop is frozen: nothing it could read of the child's answer is read yet.
        wait_for(marker.exists, 30, "the request in the child")
        time.sleep(FREEZE_S)  # the child answers and exits
        try:
            renew()
            renewed.append(None)
        except OSError as exc:  # the keeper's way: the group is gone
            renewed.append(exc)

    def started(grant: Grant, renew: Callable[[], None], revoke: Callable[[], None]) -> None:
        start(grant, renew, revoke)
        asyncio.get_running_loop().call_soon(freeze_then_renew, renew)

    monkeypatch.setattr(Grant, "start", started)
    async with WorkerHarness(isolated) as harness:
        run = await harness.submit({"mode": "sleep", "data": "0", "marker": str(marker)})
    assert len(renewed) == 1  # the renewal was tried while the answer waited unread
    assert run.message_types == ("started", "success")
