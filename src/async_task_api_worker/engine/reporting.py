"""Publishing one delivery's reports, in order, each awaited until the broker confirms it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from async_task_api_worker.context import ProgressDropReason, ProgressUpdate
from async_task_api_worker.errors import PublishError, ReportEncodeError
from async_task_api_worker.observability.redaction import exception_type_name
from async_task_api_worker.ports import (
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

__all__ = ["DeliveryReporter"]

_logger = logging.getLogger("async_task_api_worker.engine")


@dataclass(slots=True)
class DeliveryReporter:
    """The reports of one delivery: who they are for, and their sequence number.

    Every ``publish_*`` method returns whether the broker confirmed the report, and raises
    nothing but :class:`~async_task_api_worker.errors.ReportEncodeError` (for a response or
    payload that cannot be encoded); the caller decides what an unconfirmed report means.
    """

    delivery: Delivery
    attempt: int
    limit: int
    count_known: bool
    service: str
    transport: Transport
    wall_clock: Callable[[], datetime]
    notify: Callable[[EngineEvent], None]
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
        try:
            await self.transport.publish(self.delivery, encoded)
        except PublishError as exc:
            _logger.warning(
                "The %s report was not confirmed by the broker (%s)",
                report.type,
                exception_type_name(exc.__cause__ or exc),
                extra={"task_id": self.task_id, "attempt": self.attempt},
            )
            self.notify(PublishFailed(report.type))
            return False
        self.notify(ReportPublished(report.type))
        return True
