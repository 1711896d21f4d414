"""One budgeted tick on RabbitMQ: sweep, then hand new deliveries to detached workers.

The ``tick`` command (seed 002 applied to the worker's own queue):

1. connect (at most a third of the budget, and 10 s);
2. **sweep first, always**: every finished result is published as the task's terminal report,
   every marker past its deadline as a ``WORKER_DIED`` or ``TASK_TIMEOUT`` failure;
3. take up to ``max_new`` deliveries, one at a time (prefetch 1: nothing unstarted is held):
   check the envelope as the engine does, publish ``started``, write the marker and spawn the
   detached worker, and only then ack (the marker is the durable receipt);
4. stop taking work once less than ``margin_s`` of the budget is left, give back what the broker
   pushed meanwhile, close (at most 5 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from async_task_api_worker.definition import Worker
from async_task_api_worker.detached.spawn import spawn_detached
from async_task_api_worker.detached.state import MARKER_SUFFIX, RESULT_SUFFIX, write_atomically
from async_task_api_worker.detached.sweep import SweepReport, Undeliverable, sweep
from async_task_api_worker.engine.reporting import DeliveryReporter
from async_task_api_worker.errors import (
    BrokerUnavailableError,
    EnvelopeDecodeError,
    ReportEncodeError,
)
from async_task_api_worker.ports import Delivery
from async_task_api_worker.protocol.codes import ErrorCode, PoisonReason
from async_task_api_worker.protocol.envelope import decode_envelope, describe_validation_error
from async_task_api_worker.settings import WorkerSettings
from async_task_api_worker.transports.rabbitmq import RabbitMQTransport

__all__ = ["TickReport", "margin_for", "run_tick"]

_logger = logging.getLogger("async_task_api_worker.detached")

#: Seconds a tick waits for a new delivery before it decides there is none.
IDLE_WAIT_S: Final = 1.0
#: Seconds closing the connection may take.
CLOSE_TIMEOUT_S: Final = 5.0
#: A task whose terminal report went out leaves ``<task id>.done`` for this long: a redelivery
#: of its input (a tick killed before its ack) is then acked, not run again.
DONE_SUFFIX: Final = ".done"
DONE_RETENTION_S: Final = 7 * 24 * 3600.0


def margin_for(budget_s: float) -> float:
    """The part of the budget a tick keeps free at its end: 25 %, at least 6 s.

    It covers the last spawn, the give-back of a pushed delivery and the close (5 s at most).
    """
    return max(6.0, 0.25 * budget_s)


@dataclass
class TickReport:
    """What a tick did."""

    swept: SweepReport = field(default_factory=SweepReport)
    spawned: list[str] = field(default_factory=list)
    concluded: list[str] = field(default_factory=list)


class _Tick:
    def __init__(
        self, worker: Worker, target: str, settings: WorkerSettings, state_dir: Path
    ) -> None:
        self.worker = worker
        self.target = target
        self.settings = settings
        self.state_dir = state_dir
        self.task = worker.task_definition
        self.timeout_s = settings.task_timeout_s(self.task.timeout_s)
        self.report = TickReport()
        self.transport = RabbitMQTransport(
            urls=settings.broker_urls(),
            in_queue=settings.in_queue(worker.name),
            out_queue=settings.out_queue(worker.name),
            prefetch=1,
            service=worker.name,
            heartbeat_s=settings.broker_heartbeat_s,
            connect_timeout_s=10.0,
        )

    def reporter(self, delivery: Delivery, attempt: int, limit: int) -> DeliveryReporter:
        return DeliveryReporter(
            delivery=delivery,
            attempt=attempt,
            limit=limit,
            count_known=delivery.delivery_count is not None,
            service=self.worker.name,
            transport=self.transport,
            wall_clock=lambda: datetime.now(UTC),
            notify=lambda event: None,
            monotonic=time.monotonic,
            # A tick's budget is short: a report is held for at most 10 s, never for as long
            # as the broker's consumer timeout would allow.
            hold_until=time.monotonic() + min(10.0, self.settings.worker_retry_backoff_max_s),
            max_report_bytes=self.settings.worker_max_report_bytes,
        )

    async def publish_result(self, result: dict[str, Any]) -> None:
        """Publish a swept result as its task's terminal report.

        Raises:
            RuntimeError: the broker did not confirm it (the sweep keeps the result).
        """
        meta = result.get("meta") or {}
        try:
            attempt, limit = int(meta["attempt"]), int(meta["delivery_limit"])
            task_id, client_id = str(meta["task_id"]), str(meta["client_id"])
        except (KeyError, TypeError, ValueError) as exc:
            raise Undeliverable(f"no task to report to ({type(exc).__name__})") from exc
        run = self.reporter(Delivery(body=b""), attempt, limit)
        run.task_id, run.client_id, run.seq = task_id, client_id, 1
        if result.get("ok"):
            try:
                published = await run.publish_success(dict(result.get("response") or {}))
            except ReportEncodeError as exc:
                code = ErrorCode.RESULT_TOO_LARGE if exc.too_large else ErrorCode.INVALID_RESULT
                published = await run.publish_failure(code, f"the result cannot be reported: {exc}")
        else:
            error = result.get("error") or {}
            published = await run.publish_failure(
                str(error.get("code") or ErrorCode.INTERNAL_ERROR), str(error.get("message", ""))
            )
        if not published:
            raise RuntimeError("the broker did not confirm the report")
        write_atomically(self.state_dir / f"{task_id}{DONE_SUFFIX}", b"")

    async def take(self, delivery: Delivery) -> None:
        limit = self.settings.worker_delivery_limit
        attempt = (delivery.delivery_count or 0) + 1
        run = self.reporter(delivery, attempt, limit)
        try:
            envelope = decode_envelope(
                delivery.body, max_body_bytes=self.settings.worker_max_message_bytes
            )
            if envelope.service != self.worker.name:
                raise EnvelopeDecodeError(
                    PoisonReason.WRONG_SERVICE,
                    "envelope is for another service",
                    task_id=envelope.task_id,
                    client_id=envelope.client_id,
                )
        except EnvelopeDecodeError as exc:
            _logger.warning("Poison message: %s", exc, extra={"task_id": exc.task_id})
            if exc.task_id is None:
                await self.transport.reject(delivery)
                return
            run.task_id, run.client_id = exc.task_id, exc.client_id
            await self.conclude(run, delivery, ErrorCode.POISON_MESSAGE, f"refused: {exc}")
            return
        run.task_id, run.client_id = envelope.task_id, envelope.client_id
        task_id = envelope.task_id
        if any(
            (self.state_dir / f"{task_id}{suffix}").exists()
            for suffix in (MARKER_SUFFIX, RESULT_SUFFIX, DONE_SUFFIX)
        ):
            # A redelivery of work already handed out (its marker is the receipt) or done.
            await self.transport.ack(delivery)
            return
        if attempt > limit:
            await self.conclude(
                run, delivery, ErrorCode.TASK_ABANDONED_AFTER_REDELIVERIES, "past the limit"
            )
            return
        try:
            self.task.input_model.model_validate(envelope.input)
        except ValidationError as exc:
            why = f"invalid input: {describe_validation_error(exc)}"
            await self.conclude(run, delivery, ErrorCode.INVALID_INPUT, why)
            return
        if not await run.publish_started():
            await self.transport.requeue(delivery, count_attempt=False)
            return
        meta = {
            "task_id": task_id,
            "client_id": envelope.client_id,
            "attempt": attempt,
            "delivery_limit": limit,
        }
        work = {
            "input": envelope.input,
            "context": {
                **meta,
                "service": self.worker.name,
                "input_refs": [ref.model_dump(mode="json") for ref in envelope.input_refs],
            },
        }
        await asyncio.to_thread(
            spawn_detached,
            self.state_dir,
            task_id,
            work,
            handler=self.target,
            deadline_s=self.timeout_s,
            meta=meta,
            sdk_worker=True,
        )
        await self.transport.ack(delivery)  # after the marker: it is the durable receipt
        self.report.spawned.append(task_id)

    async def conclude(
        self, run: DeliveryReporter, delivery: Delivery, code: str, why: str
    ) -> None:
        if await run.publish_failure(code, why):
            await self.transport.ack(delivery)
            if run.task_id:
                self.report.concluded.append(run.task_id)
        else:
            await self.transport.requeue(delivery, count_attempt=False)


async def run_tick(
    worker: Worker,
    target: str,
    settings: WorkerSettings,
    state_dir: Path,
    *,
    budget_s: float,
    max_new: int = 1,
    margin_s: float | None = None,
) -> TickReport:
    """Run one tick (see the module) and return what it did, within ``budget_s`` seconds.

    Raises:
        BrokerRefusedError, BrokerUnavailableError: the broker could not be used.
    """
    loop = asyncio.get_running_loop()
    ends = loop.time() + budget_s
    keep_free_s = margin_for(budget_s) if margin_s is None else margin_s
    tick = _Tick(worker, target, settings, Path(state_dir))
    connect_s = max(1.0, min(10.0, budget_s / 3))
    try:
        await asyncio.wait_for(tick.transport.connect(), timeout=connect_s)
    except TimeoutError:
        raise BrokerUnavailableError(
            f"the broker did not answer within {connect_s:g} s (a third of the budget, 10 s "
            "at most)"
        ) from None
    try:

        def send(correlation_id: str, result: dict[str, Any]) -> None:
            future = asyncio.run_coroutine_threadsafe(tick.publish_result(result), loop)
            future.result(timeout=30)

        tick.report.swept = await asyncio.to_thread(sweep, tick.state_dir, send)
        _prune_done(tick.state_dir)
        deliveries = tick.transport.deliveries()
        taken = 0
        while taken < max_new and (left := ends - keep_free_s - loop.time()) > 0:
            delivery = await _next(deliveries, min(IDLE_WAIT_S, left))
            if delivery is None:
                break
            taken += 1
            await tick.take(delivery)
        await tick.transport.stop_consuming()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(tick.transport.close(), timeout=CLOSE_TIMEOUT_S)
    return tick.report


def _prune_done(state_dir: Path) -> None:
    now = time.time()
    for path in state_dir.glob(f"*{DONE_SUFFIX}"):
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > DONE_RETENTION_S:
                path.unlink()


async def _next(deliveries: AsyncIterator[Delivery], wait_s: float) -> Delivery | None:
    try:
        return await asyncio.wait_for(anext(deliveries), timeout=wait_s)
    except (TimeoutError, StopAsyncIteration):
        return None
