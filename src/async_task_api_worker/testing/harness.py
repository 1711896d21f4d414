"""Run a worker's task in memory through the real engine: no broker, no Docker.

Source: seed, "Testing your worker". Decoding, the time limit, retries, error mapping and
acknowledgements are the production code's; only the broker is the in-memory one, and retry
backoffs are a millisecond.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from async_task_api_worker.definition import Worker
from async_task_api_worker.engine import Engine
from async_task_api_worker.executors import executor_for
from async_task_api_worker.ports import Action, EngineEvent, Executor, Settlement
from async_task_api_worker.protocol.encoding import canonical_dumps
from async_task_api_worker.protocol.envelope import PROTOCOL_VERSION, InputRef
from async_task_api_worker.protocol.reports import (
    FailureReport,
    ProgressReport,
    ReportError,
    StartedReport,
    SuccessReport,
    decode_report,
)
from async_task_api_worker.settings import check_time_budget, load_settings
from async_task_api_worker.transports.memory import InMemoryTransport

__all__ = ["Outcome", "TaskRun", "WorkerHarness"]

#: The harness's retry backoffs: a millisecond, so that retry tests run fast.
HARNESS_BACKOFF_S = 0.001

AnyReport = StartedReport | ProgressReport | SuccessReport | FailureReport


class Outcome(StrEnum):
    """How the broker was told to settle a delivery."""

    ACKED = "acked"
    """Acked: the task concluded (success or failure report confirmed)."""
    NACKED_REQUEUE = "nacked_requeue"
    """Requeued: a retry, a publish that was not confirmed, or a give-back at shutdown."""
    REJECTED = "rejected"
    """Rejected without requeue (dead-lettered): a poison body with no usable task id."""
    WITHDRAWN = "withdrawn"
    """Not settled: the transport withdrew the delivery (the broker requeued it itself)."""


_OUTCOME_OF_ACTION = {
    Action.ACK: Outcome.ACKED,
    Action.CONCLUDE: Outcome.ACKED,
    Action.NACK_REQUEUE: Outcome.NACKED_REQUEUE,
    Action.REJECT: Outcome.REJECTED,
    Action.NONE: Outcome.WITHDRAWN,
}


@dataclass(frozen=True, slots=True)
class TaskRun:
    """What one delivery produced.

    Attributes:
        task_id: the envelope's task id, or ``None`` for bytes that do not carry a valid one.
        messages: the published reports, decoded, in order.
        raw: the published reports' bytes, in order.
        outcome: how the delivery was settled.
        settlement: the engine's full decision (outcome, action, code, attempt...).
    """

    task_id: str | None
    messages: tuple[AnyReport, ...]
    raw: tuple[bytes, ...]
    outcome: Outcome
    settlement: Settlement

    @property
    def message_types(self) -> tuple[str, ...]:
        """The published reports' types, in order (``("started", "progress", "success")``)."""
        return tuple(message.type for message in self.messages)

    @property
    def response(self) -> dict[str, Any] | None:
        """The ``success`` report's response, or ``None``."""
        for message in self.messages:
            if isinstance(message, SuccessReport):
                return message.response
        return None

    @property
    def error(self) -> ReportError | None:
        """The ``failure`` report's error (``code``, ``message``), or ``None``."""
        for message in self.messages:
            if isinstance(message, FailureReport):
                return message.error
        return None

    def assert_succeeded(self) -> None:
        """Assert that a ``success`` report was published and the delivery acked.

        Raises:
            AssertionError: with what happened instead.
        """
        if self.response is None or self.outcome is not Outcome.ACKED:
            raise AssertionError(f"expected a success, got {self._story()}")

    def assert_failed(self, code: str | None = None) -> None:
        """Assert that a ``failure`` report (with ``code``, if given) was published.

        Raises:
            AssertionError: with what happened instead.
        """
        if self.error is None or (code is not None and self.error.code != code):
            wanted = f"a failure with code {code}" if code else "a failure"
            raise AssertionError(f"expected {wanted}, got {self._story()}")

    def _story(self) -> str:
        error = f" error={self.error.code}: {self.error.message}" if self.error else ""
        return f"reports={list(self.message_types)} outcome={self.outcome.value}{error}"


class WorkerHarness:
    """Runs a worker's task in memory, one submitted delivery at a time.

    Example::

        async with WorkerHarness(worker) as harness:
            run = await harness.submit({"text": "hello big world"})
        run.assert_succeeded()

    Args:
        worker: the worker to test.
        settings_overrides: ``WorkerSettings`` field values (``{"worker_task_timeout_s": 0.1}``).
            No environment variable (and no ``.env``) is read; the time budget is checked as
            at startup. Retry backoffs default to a millisecond (a first backoff above that
            needs its cap, ``worker_retry_backoff_max_s``, too); every other setting is the
            production default.

        hold_s: the longest a report the broker refuses holds its delivery, in seconds (a
            short one shows a give-back quickly); default: as in production
            (``WorkerSettings.delivery_hold_s``).

    Raises:
        NoTaskError: the worker has no task.
        SettingsError: an override is invalid (``TimeBudgetError`` for the time budget).
    """

    def __init__(
        self,
        worker: Worker,
        *,
        settings_overrides: Mapping[str, Any] | None = None,
        hold_s: float | None = None,
    ) -> None:
        values: dict[str, Any] = {
            "worker_retry_backoff_s": HARNESS_BACKOFF_S,
            "worker_retry_backoff_max_s": HARNESS_BACKOFF_S,
            **dict(settings_overrides or {}),
        }
        self.worker = worker
        self.settings = load_settings(values, read_environment=False)
        task = worker.task_definition
        # The budget is checked as production would: with the overrides, but with the real
        # backoff cap, not the harness's millisecond (under which the first backoff stays).
        check_time_budget(
            load_settings(
                {"worker_retry_backoff_s": HARNESS_BACKOFF_S, **dict(settings_overrides or {})},
                read_environment=False,
            ),
            task.timeout_s,
        )
        self.transport = InMemoryTransport(
            prefetch=self.settings.worker_concurrency,
            max_body_bytes=self.settings.worker_max_message_bytes,
        )
        """The in-memory broker: its ``published``, ``acked`` and ``dead_letters``."""
        self.events: list[EngineEvent] = []
        """Every event the engine emitted (reports published, progress dropped...)."""
        self._executor: Executor = executor_for(
            worker.task_definition, self.settings.worker_concurrency
        )
        self._engine = Engine(
            worker, self.settings, self.transport, self._executor, observers=[self], hold_s=hold_s
        )
        # As the broker's prefetch does in production: at most WORKER_CONCURRENCY at once.
        self._slots = asyncio.Semaphore(self.settings.worker_concurrency)
        self._closed = False

    def notify(self, event: EngineEvent) -> None:
        """Record an engine event (the harness observes its own engine)."""
        self.events.append(event)

    async def __aenter__(self) -> WorkerHarness:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Release the executor (its threads); idempotent."""
        if not self._closed:
            self._closed = True
            await self._executor.aclose()
            await self.transport.close()

    async def submit(
        self,
        task_input: Mapping[str, Any],
        *,
        client_id: str = "test-client",
        input_refs: Sequence[InputRef | Mapping[str, Any]] = (),
        delivery_count: int = 0,
        acquired_count: int | None = None,
        task_id: str | None = None,
    ) -> TaskRun:
        """Build the envelope the API would publish, deliver it once, and return what happened.

        Args:
            task_input: the task input (a JSON object).
            client_id: the envelope's client id.
            input_refs: input references, as :class:`InputRef` or plain mappings.
            delivery_count: the broker's ``x-delivery-count`` for this delivery (0: the first);
                the attempt is ``delivery_count + 1``.
            acquired_count: the broker's ``x-acquired-count`` (earlier hand-outs, RabbitMQ
                4.3+; default: ``delivery_count``); past ``WORKER_ACQUIRED_LIMIT`` the task is
                abandoned.
            task_id: the task id (default: a new UUID).

        Returns:
            The :class:`TaskRun`.
        """
        envelope = {
            "protocol_version": PROTOCOL_VERSION,
            "task_id": str(uuid.uuid4()) if task_id is None else task_id,
            "client_id": client_id,
            "service": self.worker.name,
            "input": dict(task_input),
            "input_refs": [
                ref.model_dump(exclude_none=True) if isinstance(ref, InputRef) else dict(ref)
                for ref in input_refs
            ],
        }
        return await self.submit_raw(
            canonical_dumps(envelope), delivery_count=delivery_count, acquired_count=acquired_count
        )

    async def submit_raw(
        self, body: bytes, *, delivery_count: int = 0, acquired_count: int | None = None
    ) -> TaskRun:
        """Deliver ``body`` as it is (a poison message, a hand-made envelope) once.

        Concurrent calls run at most ``worker_concurrency`` deliveries at once, as the broker's
        prefetch allows in production; the others wait their turn.

        Raises:
            RuntimeError: the harness is closed.
        """
        if self._closed:
            raise RuntimeError("the harness is closed")
        message = self.transport.put(
            body, delivery_count=delivery_count, acquired_count=acquired_count
        )
        delivery = self.transport.take(message.message_id)
        if delivery is None:  # pragma: no cover - just put, and only this call takes it
            raise RuntimeError("the submitted message vanished from the in-memory queue")
        async with self._slots:
            settlement = await self._engine.handle(delivery)
        raw = tuple(
            item.report.body
            for item in self.transport.published
            if item.message_id == message.message_id
        )
        return TaskRun(
            task_id=settlement.task_id,
            messages=tuple(decode_report(body) for body in raw),
            raw=raw,
            outcome=_OUTCOME_OF_ACTION[settlement.action],
            settlement=settlement,
        )

    def cancel(self, task_id: str) -> str:
        """Cancel ``task_id`` as a client's cancel request would (docs/protocol.md).

        A run of it in progress (a :meth:`submit` not yet returned) stops: an ``async def``
        handler is cancelled, a ``def`` handler's ``ctx.cancelled`` turns true, and the run
        concludes with ``failure TASK_CANCELLED``. Called before the task is submitted, the
        cancel is remembered, and the submitted task concludes so without running. Use it to
        test a handler's cleanup::

            run = asyncio.create_task(harness.submit({"n": 1}, task_id="t-1"))
            await started.wait()  # an event the handler sets
            harness.cancel("t-1")
            (await run).assert_failed("TASK_CANCELLED")

        Returns:
            What the cancel did: ``running``, ``remembered``, ``finished`` or
            ``not_remembered`` (``engine.cancels.CancelResult``).
        """
        return self._engine.cancels.request(task_id).value

    def fail_next_publish(
        self,
        type: str | None = None,  # noqa: A002 - the seed's name
        *,
        times: int | None = 1,
    ) -> None:
        """Make the next publishes (of reports of ``type``, or of any) fail.

        A report that is not confirmed is held and tried again until the broker could time its
        delivery out (``WORKER_CONSUMER_TIMEOUT_S - WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S``
        after its arrival), then the delivery is given back: a few failures end in a success;
        to see the give-back, fail every try (``times=None``) and shorten those two settings.

        Args:
            type: ``started``, ``progress``, ``success`` or ``failure``; ``None``: any report.
            times: how many publishes fail; ``None``: all, until
                :meth:`clear_publish_failures`.
        """
        self.transport.fail_next_publish(type, times=times)

    def clear_publish_failures(self) -> None:
        """The broker takes reports again: forget what :meth:`fail_next_publish` asked for."""
        self.transport.clear_publish_failures()
