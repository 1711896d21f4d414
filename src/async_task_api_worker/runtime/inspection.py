"""A worker process's answer to an operator's ``inspect`` (docs/commands.md, "inspect").

Built only when asked, from what the engine keeps anyway: the cancel book's running tasks, each
with its delivery's reporter (attempt, arrival). Nothing is added per delivery for it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

from async_task_api_worker._version import __version__
from async_task_api_worker.errors import ProtocolError
from async_task_api_worker.protocol.inspect import decode_inspect_request, encode_inspect_reply

__all__ = ["Inspection"]

_logger = logging.getLogger("async_task_api_worker.runtime")


class Inspection:
    """Answers inspect requests for one worker process.

    Args:
        service: the worker's service name.
        concurrency: ``WORKER_CONCURRENCY``.
        running: ``(task id, attempt, elapsed_s)`` of each task running now
            (``engine.cancels.CancelBook.running``).
        monotonic: the clock the uptime is counted on, in seconds.
    """

    def __init__(
        self,
        service: str,
        concurrency: int,
        running: Callable[[], list[tuple[str, int, float]]],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._service = service
        self._concurrency = concurrency
        self._running = running
        self._monotonic = monotonic
        self._started_at = monotonic()

    def answer(self, body: bytes, consumer_tag: str | None) -> bytes | None:
        """The reply to the request ``body`` (``protocol.inspect``); ``None`` if it is not one.

        ``consumer_tag``: this process's on the input queue, if any. A refused body is logged
        (why, never its content).
        """
        try:
            request = decode_inspect_request(body)
        except ProtocolError as exc:
            _logger.warning("An inspect request was refused: %s", exc)
            return None
        tasks = self._running()
        _logger.info(
            "Inspect request %s from %s: answering (%d task(s) running)",
            request.request_id,
            request.client_id,
            len(tasks),
        )
        return encode_inspect_reply(
            request,
            service=self._service,
            host=socket.gethostname(),
            pid=os.getpid(),
            sdk=f"async-task-api-worker {__version__}",
            concurrency=self._concurrency,
            uptime_s=self._monotonic() - self._started_at,
            consumer_tag=consumer_tag,
            tasks=tasks,
        )
