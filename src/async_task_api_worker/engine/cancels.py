"""Cancel requests from clients: which running task they stop, and which they wait for.

A client's cancel (docs/protocol.md, "Cancelling a task") names a task id. The
:class:`CancelBook` knows the tasks running here (each with a token that stops its handler) and
the tasks that finished here lately; a cancel for a task in neither is remembered, bounded in
count and in time (``WORKER_CANCEL_MEMORY``, ``WORKER_CANCEL_MEMORY_S``), so that the task,
when its delivery arrives, concludes without running. Every worker of a service receives every
cancel (a fanout exchange): the one running the task stops it, the others remember it in case
the task comes to them later.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Protocol

from async_task_api_worker.errors import CancelDecodeError
from async_task_api_worker.ports import CancelRequested, CancelResult, CancelToken, EngineEvent
from async_task_api_worker.protocol.cancel import decode_cancel

__all__ = ["CANCEL_REASON", "CancelBook", "CancelResult", "Cancels"]

_logger = logging.getLogger("async_task_api_worker.engine")

#: The reason a client's cancel gives the running task's token.
CANCEL_REASON: Final = "cancelled by its client"


class Running(Protocol):
    """What the book reads of a run when asked what runs (``inspect``): the delivery's reporter."""

    @property
    def attempt(self) -> int:
        """The run's attempt."""
        ...

    @property
    def arrived_at(self) -> float:
        """When its delivery arrived, on the engine's monotonic clock."""
        ...


class CancelBook:
    """The running tasks' cancel tokens, the cancels remembered, the tasks finished lately.

    Args:
        memory: how many remembered cancels (and finished task ids) are kept; the oldest go
            first. 0 remembers nothing.
        memory_s: how long each is kept, in seconds.
        monotonic: the clock, in seconds.

    Call everything on the event loop: a token's cancel stops a handler from there.
    """

    def __init__(self, memory: int, memory_s: float, monotonic: Callable[[], float]) -> None:
        self._memory = memory
        self._memory_s = memory_s
        self._monotonic = monotonic
        # Per task id, its runs here: each token with the run's reporter (read only when an
        # operator asks what runs: nothing is built per delivery for that).
        self._running: dict[str, dict[CancelToken, Running]] = {}
        self._remembered: OrderedDict[str, float] = OrderedDict()
        self._finished: OrderedDict[str, float] = OrderedDict()

    def request(self, task_id: str) -> CancelResult:
        """Cancel ``task_id``: stop it if it runs here, else remember the request."""
        tokens = self._running.get(task_id)
        if tokens:
            for token in tokens:
                token.cancel(CANCEL_REASON)
            return CancelResult.RUNNING
        if self._fresh(self._finished, task_id):
            return CancelResult.FINISHED
        if self._memory == 0:
            return CancelResult.NOT_REMEMBERED
        self._keep(self._remembered, task_id)
        return CancelResult.REMEMBERED

    def start(self, task_id: str, run: Running) -> CancelToken:
        """Register a run of ``task_id``; its token is cancelled already when a cancel came first.

        ``run`` (the delivery's reporter) is what :meth:`running` reads of it. Call
        :meth:`finish` with the token when the run ends, whatever happened.
        """
        token = CancelToken()
        if self._fresh(self._remembered, task_id):
            del self._remembered[task_id]
            token.cancel(CANCEL_REASON)
        self._running.setdefault(task_id, {})[token] = run
        return token

    def running(self) -> list[tuple[str, int, float]]:
        """``(task id, attempt, seconds since its delivery came)`` of each run here now.

        Built when asked (``inspect``).
        """
        now = self._monotonic()
        return [
            (task_id, run.attempt, now - run.arrived_at)
            for task_id, runs in self._running.items()
            for run in runs.values()
        ]

    def finish(self, task_id: str, token: CancelToken, *, concluded: bool) -> None:
        """End the run of ``token``; ``concluded``: the task got its terminal report here.

        A cancelled run that did not conclude (its delivery went back to the queue: a retry, a
        ``TASK_CANCELLED`` report the broker would not take, a shutdown) leaves its cancel
        remembered, so that the task's next delivery here concludes without running.
        """
        tokens = self._running.get(task_id, {})
        tokens.pop(token, None)
        if not tokens:
            self._running.pop(task_id, None)
        if not self._memory:
            return
        if concluded:
            self._keep(self._finished, task_id)
        elif token.cancelled:
            self._keep(self._remembered, task_id)

    def _fresh(self, book: OrderedDict[str, float], task_id: str) -> bool:
        """Whether ``task_id`` is in ``book`` and not expired (expired entries are dropped)."""
        now = self._monotonic()
        while book:
            oldest, kept_at = next(iter(book.items()))
            if now - kept_at < self._memory_s:
                break
            del book[oldest]
        return task_id in book

    def _keep(self, book: OrderedDict[str, float], task_id: str) -> None:
        book[task_id] = self._monotonic()
        book.move_to_end(task_id)
        while len(book) > self._memory:
            book.popitem(last=False)


_WORDS: Final = {
    CancelResult.RUNNING: "it runs here: it is stopped and concludes TASK_CANCELLED, unless it "
    "concluded first",
    CancelResult.REMEMBERED: "not running here; remembered, in case its delivery comes",
    CancelResult.FINISHED: "it finished here already; its terminal report stands",
    CancelResult.NOT_REMEMBERED: "not running here, and WORKER_CANCEL_MEMORY=0: forgotten",
}


class Cancels:
    """A worker's cancel requests: the :class:`CancelBook`, and a log line and an event each.

    Args:
        book: the running tasks and the remembered cancels.
        service: the worker's name, for the log lines.
        notify: where the :class:`~async_task_api_worker.ports.CancelRequested` events go.
    """

    def __init__(
        self, book: CancelBook, service: str, notify: Callable[[EngineEvent], None]
    ) -> None:
        self.book = book
        self._service = service
        self._notify = notify

    def request(self, task_id: str) -> CancelResult:
        """Cancel ``task_id`` (docs/protocol.md, "Cancelling a task"); log and count it.

        A task running here stops and concludes with ``failure TASK_CANCELLED``; one not
        running here is remembered (``WORKER_CANCEL_MEMORY``, ``WORKER_CANCEL_MEMORY_S``) and
        concludes so without running if its delivery comes; one that finished here lately is
        left as it is. Call on the event loop.
        """
        result = self.book.request(task_id)
        level = logging.WARNING if result is CancelResult.NOT_REMEMBERED else logging.INFO
        _logger.log(
            level,
            "Cancel request for task %s: %s",
            task_id,
            _WORDS[result],
            extra={"task_id": task_id, "service": self._service, "cancel_result": result.value},
        )
        self._notify(CancelRequested(result.value))
        return result

    def request_body(self, body: bytes) -> CancelResult:
        """Read a cancel request's body and :meth:`request` it; never raises.

        A body that is not a cancel request is logged (its reason, never its content) and
        counted as ``malformed``.
        """
        try:
            request = decode_cancel(body)
        except CancelDecodeError as exc:
            _logger.warning(
                "A cancel request was refused (%s)%s: %s",
                exc.reason,
                "" if exc.task_id is None else f" for task {exc.task_id}",
                exc,
                extra={
                    "service": self._service,
                    "cancel_result": CancelResult.MALFORMED.value,
                    "task_id": exc.task_id,
                },
            )
            self._notify(CancelRequested(CancelResult.MALFORMED.value))
            return CancelResult.MALFORMED
        return self.request(request.task_id)
