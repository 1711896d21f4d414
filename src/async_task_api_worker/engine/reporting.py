"""Publishing one delivery's reports, in order, each awaited until the broker confirms it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from async_task_api_worker.context import ProgressDropReason, ProgressUpdate, task_log_extra
from async_task_api_worker.errors import PublishError, ReportEncodeError
from async_task_api_worker.observability.redaction import exception_type_name
from async_task_api_worker.ports import (
    CancelToken,
    Delivery,
    EngineEvent,
    ProgressDropped,
    PublishFailed,
    ReportPublished,
    Transport,
)
from async_task_api_worker.protocol.reports import (
    MAX_ERROR_MESSAGE_CHARS,
    FailureReport,
    ProgressReport,
    ReportError,
    StartedReport,
    SuccessReport,
    encode_report,
    format_timestamp,
)

__all__ = ["PUBLISH_RETRY_FIRST_S", "PUBLISH_RETRY_MAX_S", "DeliveryReporter"]

#: The first wait before publishing an unconfirmed report again, in seconds; it doubles.
PUBLISH_RETRY_FIRST_S: Final = 0.1
#: The longest wait between two tries, in seconds.
PUBLISH_RETRY_MAX_S: Final = 5.0

_logger = logging.getLogger("async_task_api_worker.engine")


@dataclass(slots=True)
class DeliveryReporter:
    """The reports of one delivery: who they are for, and their sequence number.

    Every ``publish_*`` method returns whether the broker confirmed the report, and raises
    nothing but :class:`~async_task_api_worker.errors.ReportEncodeError` (for a response or
    payload that cannot be encoded); the caller decides what an unconfirmed report means. A
    report other than ``progress`` is tried again, with a backoff from 0.1 s to 5 s, for up to
    ``retry_window_s`` seconds, unless the transport withdraws the delivery meanwhile.
    """

    delivery: Delivery
    attempt: int
    limit: int
    count_known: bool
    service: str
    transport: Transport
    wall_clock: Callable[[], datetime]
    notify: Callable[[EngineEvent], None]
    monotonic: Callable[[], float]
    retry_window_s: float
    task_id: str | None = None
    client_id: str | None = None
    seq: int = 0

    def _fields(self) -> dict[str, Any]:
        return {
            "protocol_version": 1,
            "task_id": self.task_id,
            "client_id": self.client_id,
            "service": self.service,
            "attempt": self.attempt,
            "timestamp": format_timestamp(self.wall_clock()),
        }

    async def publish_started(self) -> bool:
        """Publish ``started``."""
        return await self._publish(StartedReport.model_construct(**self._fields()))

    async def publish_success(self, response: dict[str, Any]) -> bool:
        """Publish ``success``.

        Raises:
            ReportEncodeError: the response is not canonical JSON or the report is too large.
        """
        return await self._publish(
            SuccessReport.model_construct(**self._fields(), response=response)
        )

    async def publish_failure(self, code: str, message: str) -> bool:
        """Publish ``failure`` with ``code`` and ``message`` (cut to 1,024 characters)."""
        error = ReportError.model_construct(code=code, message=message[:MAX_ERROR_MESSAGE_CHARS])
        return await self._publish(FailureReport.model_construct(**self._fields(), error=error))

    async def publish_progress(self, update: ProgressUpdate) -> bool:
        """Publish ``progress``; a payload that cannot be encoded is dropped and counted."""
        payload = None if update.payload is None else dict(update.payload)
        report = ProgressReport.model_construct(
            **self._fields(), fraction=update.fraction, payload=payload
        )
        try:
            published = await self._publish(report)
        except ReportEncodeError:
            self.notify(ProgressDropped(ProgressDropReason.INVALID_PAYLOAD.value))
            return False
        if not published:
            self.notify(ProgressDropped(ProgressDropReason.PUBLISH_FAILED.value))
        return published

    async def _publish(
        self, report: StartedReport | ProgressReport | SuccessReport | FailureReport
    ) -> bool:
        encoded = encode_report(report, seq=self.seq)
        self.seq += 1
        # Progress is best-effort; any other report is retried in place, holding the delivery
        # (and so its prefetch slot: a worker whose reports cannot get out stops taking work)
        # for at most WORKER_RETRY_BACKOFF_MAX_S, which the time-budget rule already reserves.
        give_up_at = self.monotonic() + (0.0 if report.type == "progress" else self.retry_window_s)
        delay_s = PUBLISH_RETRY_FIRST_S
        while True:
            try:
                await self.transport.publish(self.delivery, encoded)
            except PublishError as exc:
                self.notify(PublishFailed(report.type))
                withdrawn = self.delivery.cancel_token.cancelled
                retry = not withdrawn and self.monotonic() + delay_s <= give_up_at
                _logger.warning(
                    "The %s report was not confirmed by the broker (%s)%s",
                    report.type,
                    exception_type_name(exc.__cause__ or exc),
                    f"; retrying in {delay_s:g} s" if retry else "",
                    extra=task_log_extra({"task_id": self.task_id, "attempt": self.attempt}),
                )
                if not retry or not await _sleep_unless(self.delivery.cancel_token, delay_s):
                    return False
                delay_s = min(delay_s * 2, PUBLISH_RETRY_MAX_S)
                continue
            self.notify(ReportPublished(report.type))
            return True


async def _sleep_unless(token: CancelToken, delay_s: float) -> bool:
    """Sleep ``delay_s`` seconds; ``False`` at once if ``token`` is cancelled meanwhile."""
    woken = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    remove = token.add_callback(wake)
    try:
        await asyncio.wait_for(woken, timeout=delay_s)
    except TimeoutError:
        return True
    finally:
        remove()
    return False
