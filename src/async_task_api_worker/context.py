"""What a handler receives besides its input: :class:`TaskContext` and :class:`SyncTaskContext`.

Progress is latest-state, not an event stream (seed "Declaring a worker"): the context checks
each update (``fraction`` in [0, 1), never going back; a JSON-object payload) and hands the
accepted ones to a :class:`ProgressSink`, which throttles and publishes them. A refused update is
dropped and counted, never raised into the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final, Protocol

from pydantic import BaseModel

from async_task_api_worker.errors import ReportEncodeError, TaskCancelledError
from async_task_api_worker.protocol.encoding import canonical_dumps, check_tree
from async_task_api_worker.protocol.envelope import InputRef

if TYPE_CHECKING:  # the engine hands the token in; the context only reads it
    from async_task_api_worker.cancel_token import CancelToken

__all__ = [
    "ProgressDropReason",
    "ProgressSink",
    "ProgressUpdate",
    "SyncTaskContext",
    "TaskContext",
    "bind_task_fields",
    "current_task_fields",
    "progress_sink_of",
    "task_log_extra",
]


_logger = logging.getLogger("async_task_api_worker.task")


class ProgressDropReason(StrEnum):
    """Why a progress update was not published (``worker_progress_dropped_total{reason}``)."""

    OUT_OF_RANGE = "out_of_range"
    """``fraction`` is not a finite number in [0, 1)."""
    BACKWARDS = "backwards"
    """``fraction`` is below one already accepted for this attempt."""
    INVALID_PAYLOAD = "invalid_payload"
    """``payload`` is not a JSON object (or a pydantic model), or not encodable."""
    SUPERSEDED = "superseded"
    """A newer update replaced it while it waited for the throttle."""
    AFTER_END = "after_end"
    """It came after the task's terminal report (a late call from a timed-out thread)."""
    PUBLISH_FAILED = "publish_failed"
    """The broker did not confirm it (progress is best-effort: the task goes on)."""


@dataclass(frozen=True, slots=True)
class ProgressUpdate:
    """One accepted progress update: ``fraction`` in [0, 1) and an optional JSON object."""

    fraction: float
    payload: Mapping[str, Any] | None = None


class ProgressSink(Protocol):
    """Receives a task's progress updates, on the event loop's thread."""

    def offer(self, update: ProgressUpdate) -> None:
        """Take an accepted update (the sink throttles; a newer one replaces a held one)."""
        ...

    def drop(self, reason: ProgressDropReason) -> None:
        """Count an update refused by the context."""
        ...


_task_fields: ContextVar[Mapping[str, Any] | None] = ContextVar(
    "async_task_api_worker_task_fields", default=None
)


def current_task_fields() -> Mapping[str, Any] | None:
    """The fields of the task running in this context (``task_id``, ``service``, ``attempt``)."""
    return _task_fields.get()


@contextmanager
def bind_task_fields(fields: Mapping[str, Any]) -> Iterator[None]:
    """Bind task fields for the code run in this context.

    asyncio tasks and ``asyncio.to_thread`` copy the context, and so do the SDK's ``def``
    handler threads; a plain ``threading.Thread`` does not (start it with
    ``contextvars.copy_context().run``).
    """
    token = _task_fields.set(fields)
    try:
        yield
    finally:
        _task_fields.reset(token)


def task_log_extra(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` for a logging call's ``extra``, minus those the record factory already sets.

    ``logging`` refuses (``KeyError``) an ``extra`` key a record already has, and an
    application that chains ``TaskContextFilter`` into its record factory (the documented
    recipe) sets the task fields on every record made while a task runs: passing them again
    would make the logging call raise inside the handler.
    """
    factory = logging.getLogRecordFactory()
    if factory is logging.LogRecord or current_task_fields() is None:
        return dict(fields)
    probe = factory("probe", logging.INFO, "", 0, "", (), None)
    return {name: value for name, value in fields.items() if name not in probe.__dict__}


class _TaskLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Adds the task fields to each record, keeping the caller's own ``extra``."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = task_log_extra({**(self.extra or {}), **(kwargs.get("extra") or {})})
        return msg, kwargs


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _ProgressGate:
    """Checks updates and remembers the highest fraction accepted (one per task attempt).

    The payload is encoded when the handler calls ``progress``, not later: a payload that
    cannot be published is refused at once (it never replaces a good held update), and the
    snapshot cannot change under the encoder if the handler keeps mutating its dict.
    """

    __slots__ = ("_highest", "_loop", "_warned", "sink")

    def __init__(self, sink: ProgressSink, loop: asyncio.AbstractEventLoop | None) -> None:
        self.sink = sink
        self._loop = loop
        self._highest = 0.0
        self._warned = False

    def submit(self, fraction: object, payload: object) -> None:
        """Check an update and hand the result to the sink, on the sink's loop."""
        try:
            result = self._check(fraction, payload)
        except (
            Exception
        ):  # a number or payload whose own methods raise: never the handler's problem
            result = ProgressDropReason.INVALID_PAYLOAD
        loop = self._loop
        if loop is None or _running_loop() is loop:
            self._deliver(result)
            return
        # Another thread (a def handler, asyncio.to_thread, a loop of the handler's own):
        # the sink lives on the engine's loop. A closed loop means nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._deliver, result)

    def _check(self, fraction: object, payload: object) -> ProgressUpdate | ProgressDropReason:
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            return ProgressDropReason.OUT_OF_RANGE
        try:
            value = float(fraction)
        except OverflowError:  # an int beyond a double
            return ProgressDropReason.OUT_OF_RANGE
        if not math.isfinite(value) or not 0.0 <= value < 1.0:
            return ProgressDropReason.OUT_OF_RANGE
        if value < self._highest:
            return ProgressDropReason.BACKWARDS
        snapshot = None
        if payload is not None:
            if isinstance(payload, BaseModel):
                payload = payload.model_dump(mode="json")
            if not isinstance(payload, dict):
                return ProgressDropReason.INVALID_PAYLOAD
            try:
                # Valid Unicode, as a response must be: refused here, not escaped (a report
                # could not carry it: protocol.encoding.check_tree).
                check_tree(payload, valid_unicode=True)
                snapshot = json.loads(canonical_dumps(payload, tree_checked=True))
            except ReportEncodeError:
                return ProgressDropReason.INVALID_PAYLOAD
        self._highest = value
        return ProgressUpdate(value, snapshot)

    def _deliver(self, result: ProgressUpdate | ProgressDropReason) -> None:
        if isinstance(result, ProgressUpdate):
            self.sink.offer(result)
            return
        hint = _REFUSED_CALLS.get(result)
        if hint is not None and not self._warned:
            # The call raises nothing (progress must never fail a task), so say it once.
            self._warned = True
            _logger.warning(
                "A progress update was dropped (%s): %s; later ones of this task that are "
                "dropped are only counted (worker_progress_dropped_total)",
                result.value,
                hint,
            )
        self.sink.drop(result)


#: The updates refused for what the call passed, with what to do instead.
_REFUSED_CALLS: Final = {
    ProgressDropReason.OUT_OF_RANGE: "the fraction must be a finite number in [0, 1); the "
    "terminal report is the 100 %, so return the result instead of ctx.progress(1.0)",
    ProgressDropReason.BACKWARDS: "the fraction is below one this task already reported",
    ProgressDropReason.INVALID_PAYLOAD: "the payload must be a JSON object (a dict or a "
    "pydantic model) that canonical JSON can encode, in valid Unicode (no lone surrogate)",
}


class _ContextBase:
    __slots__ = (
        "_cancel",
        "_gate",
        "attempt",
        "client_id",
        "delivery_limit",
        "input_refs",
        "logger",
        "service",
        "task_id",
    )

    def __init__(
        self,
        *,
        task_id: str,
        client_id: str,
        service: str,
        attempt: int,
        delivery_limit: int,
        input_refs: tuple[InputRef, ...],
        sink: ProgressSink,
        loop: asyncio.AbstractEventLoop | None = None,
        cancel: CancelToken | None = None,
    ) -> None:
        self._cancel = cancel
        self.task_id = task_id
        self.client_id = client_id
        self.service = service
        self.attempt = attempt
        self.delivery_limit = delivery_limit
        self.input_refs = input_refs
        self.logger: logging.LoggerAdapter[logging.Logger] = _TaskLogger(
            logging.getLogger(f"async_task_api_worker.task.{service}"),
            {"task_id": task_id, "service": service, "attempt": attempt},
        )
        # loop: where the sink lives; None delivers in the caller's thread (a test's context).
        self._gate = _ProgressGate(sink, loop)

    @property
    def cancelled(self) -> bool:
        """Whether the task's client cancelled it (docs/protocol.md, "Cancelling a task").

        The worker concludes the task with ``failure TASK_CANCELLED`` as soon as the cancel
        arrives and stops an ``async def`` handler itself; a ``def`` handler runs on in its
        thread until it looks here (or calls :meth:`raise_if_cancelled`) and returns. Safe to
        read from any thread.
        """
        return self._cancel is not None and self._cancel.cancelled

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~async_task_api_worker.errors.TaskCancelledError` if :attr:`cancelled`.

        Call it between steps of a long ``def`` handler, so that its thread stops soon after a
        cancel; what it raises is not reported (the task was concluded already).
        """
        if self.cancelled:
            raise TaskCancelledError("the task was cancelled by its client")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(task_id={self.task_id!r}, service={self.service!r}, "
            f"attempt={self.attempt}/{self.delivery_limit})"
        )


class TaskContext(_ContextBase):
    """The context of an ``async def`` handler.

    The SDK builds it for each delivery; a test builds one with
    ``async_task_api_worker.testing.make_task_context``. Its constructor is not API.

    Attributes:
        task_id: the envelope's task id.
        client_id: the envelope's client id.
        service: the worker's service name.
        attempt: this delivery's attempt, from 1 (every hand-out by the broker counts).
        delivery_limit: the attempts the task gets (``WORKER_DELIVERY_LIMIT``).
        input_refs: the envelope's input references, in order.
        logger: a logger whose records carry ``task_id``, ``service`` and ``attempt``.
        cancelled: whether the task's client cancelled it (a property; see below), with
            ``raise_if_cancelled()`` to stop there.
    """

    async def progress(
        self, fraction: float, payload: Mapping[str, Any] | BaseModel | None = None
    ) -> None:
        """Report the task's latest progress.

        At most one ``progress`` report is published per ``WORKER_PROGRESS_MIN_INTERVAL_S``
        (default 1 s); a newer update replaces one still waiting; one still waiting when the
        handler returns is published just before the terminal report.

        Args:
            fraction: how much is done, in [0, 1) (the terminal report is the 100%); never
                below an earlier accepted value.
            payload: an optional JSON object (or pydantic model) with the task's own state.

        An update that breaks these rules, or whose payload is not a JSON object that can be
        published, is dropped and counted (``worker_progress_dropped_total{reason}``), never
        raised. The payload is copied when you call: changing the dict afterwards changes
        nothing. Safe to call from any thread.
        """
        self._gate.submit(fraction, payload)


class SyncTaskContext(_ContextBase):
    """The context of a ``def`` handler, which runs in a worker thread.

    Same attributes as :class:`TaskContext`, ``cancelled`` and ``raise_if_cancelled()``
    included (a ``def`` handler stops only where it looks at them); :meth:`progress` is a plain
    call that hands the update to the event loop without waiting. The SDK builds it for each
    delivery; a test builds one with ``async_task_api_worker.testing.make_sync_task_context``.
    Its constructor is not API.
    """

    def progress(
        self, fraction: float, payload: Mapping[str, Any] | BaseModel | None = None
    ) -> None:
        """Report the task's latest progress; same rules as :meth:`TaskContext.progress`."""
        self._gate.submit(fraction, payload)


def progress_sink_of(context: TaskContext | SyncTaskContext) -> ProgressSink:
    """Where ``context`` hands its checked updates (an executor's relay).

    An executor that runs the handler in another process checks the updates there, with that
    process's own context, and forwards the accepted ones (and the drops) to this sink.
    """
    return context._gate.sink
