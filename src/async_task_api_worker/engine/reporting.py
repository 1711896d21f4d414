"""Publishing one delivery's reports, in order, each awaited until the broker confirms it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from async_task_api_worker.context import ProgressDropReason, ProgressUpdate, task_log_extra
from async_task_api_worker.errors import PublishError, ReportEncodeError, ReportRefusedError
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
from async_task_api_worker.protocol.encoding import MAX_REPORT_BYTES
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

__all__ = [
    "PROGRESS_CONFIRM_WAIT_S",
    "PUBLISH_RETRY_FIRST_S",
    "PUBLISH_RETRY_MAX_S",
    "DeliveryReporter",
    "GiveUp",
    "until",
]

#: The first wait before publishing an unconfirmed report again, in seconds; it doubles.
PUBLISH_RETRY_FIRST_S: Final = 0.1
#: The longest wait between two tries, in seconds.
PUBLISH_RETRY_MAX_S: Final = 5.0
#: How long a ``progress`` report (best-effort, never retried) waits for its confirm, in seconds.
PROGRESS_CONFIRM_WAIT_S: Final = 30.0
#: The last try of a held report starts at least this long before the hold ends, in seconds.
LAST_TRY_MARGIN_S: Final = 0.5
#: While a report is held, its refusals are logged at most once per this many seconds.
HOLD_LOG_EVERY_S: Final = 60.0

_logger = logging.getLogger("async_task_api_worker.engine")


class GiveUp(StrEnum):
    """Why a report other than ``progress`` was not confirmed (the decision line's ``reason``)."""

    #: Still unconfirmed when the broker could soon time out the delivery (``consumer_timeout``).
    HOLD_EXPIRED = "report_held_until_consumer_timeout"
    #: The transport withdrew the delivery (its channel closed; the broker requeued it).
    WITHDRAWN = "delivery_withdrawn"
    #: The grace period of a shutdown ran out while the report was held.
    ABORTED = "grace_period_over"


@dataclass(slots=True)
class DeliveryReporter:
    """The reports of one delivery: who they are for, and their sequence number.

    Every ``publish_*`` method returns whether the broker confirmed the report, and raises
    nothing but :class:`~async_task_api_worker.errors.ReportEncodeError` (a response or payload
    that cannot be encoded, or a report larger than ``max_report_bytes`` or than the broker
    takes); the caller decides what an unconfirmed report means, and :attr:`gave_up` says why.

    A report other than ``progress`` is held and tried again, with a backoff from 0.1 s to 5 s,
    until ``hold_until`` (on the ``monotonic`` clock): a broker that refuses reports for a
    while (a full output queue, an alarm, a partition) does not cost the task. A confirm that is
    merely late is waited for, not taken as a refusal. It stops early when the transport
    withdraws the delivery, or when ``abort`` is cancelled (a shutdown's grace period is over).
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
    hold_until: float
    max_report_bytes: int = MAX_REPORT_BYTES
    abort: CancelToken | None = None
    task_id: str | None = None
    client_id: str | None = None
    seq: int = 0
    gave_up: GiveUp | None = None

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
            ReportEncodeError: the response is not canonical JSON, or the report is larger than
                ``max_report_bytes`` or than the broker accepts (``too_large`` is then true), or
                the broker refused it for its content (``ReportRefusedError``).
        """
        return await self._publish(
            SuccessReport.model_construct(**self._fields(), response=response)
        )

    async def publish_failure(self, code: str, message: str) -> bool:
        """Publish ``failure`` with ``code`` and ``message`` (cut to 1,024 characters)."""
        error = ReportError.model_construct(code=code, message=message[:MAX_ERROR_MESSAGE_CHARS])
        try:
            return await self._publish(FailureReport.model_construct(**self._fields(), error=error))
        except ReportEncodeError:  # only a broker whose size limit is below a small report
            self.gave_up = GiveUp.HOLD_EXPIRED
            return False

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

    def _stopped(self) -> GiveUp | None:
        if self.delivery.cancel_token.cancelled:
            return GiveUp.WITHDRAWN
        if self.abort is not None and self.abort.cancelled:
            return GiveUp.ABORTED
        return None

    async def _publish(
        self, report: StartedReport | ProgressReport | SuccessReport | FailureReport
    ) -> bool:
        encoded = encode_report(report, seq=self.seq, max_bytes=self.max_report_bytes)
        self.seq += 1
        progress = report.type == "progress"
        give_up_at = self.hold_until
        if progress:
            give_up_at = min(give_up_at, self.monotonic() + PROGRESS_CONFIRM_WAIT_S)
        delay_s = PUBLISH_RETRY_FIRST_S
        refusals, logged_at = 0, 0.0
        while True:
            why = self._stopped()
            if why is None and self.monotonic() >= give_up_at:
                why = GiveUp.HOLD_EXPIRED
            if why is not None:
                if not progress:
                    self.gave_up = why
                    _logger.warning(
                        "The %s report could not get out (%s); %s",
                        report.type,
                        why.value,
                        "the delivery was withdrawn: nothing more is sent for it"
                        if why is GiveUp.WITHDRAWN
                        else "giving the delivery back",
                        extra=self._log_extra(),
                    )
                return False
            try:
                confirmed = await until(
                    self.transport.publish(self.delivery, encoded),
                    give_up_at - self.monotonic(),
                    self.delivery.cancel_token,
                    self.abort,
                )
            except ReportRefusedError as exc:
                # Refused for what it holds (its size, Step Functions' InvalidOutput): trying
                # again cannot help, and the task concludes with the failure this becomes.
                self.notify(PublishFailed(report.type))
                for_what = "for its size" if exc.too_large else "for its content"
                raise ReportEncodeError(
                    f"the broker refused the {report.type} report of {len(encoded.body)} bytes "
                    f"{for_what} ({exc})",
                    too_large=exc.too_large,
                ) from exc
            except PublishError as exc:
                self.notify(PublishFailed(report.type))
                if self._stopped() is not None:
                    continue  # withdrawn or aborted meanwhile: said once, at the loop's top
                refusals += 1
                now = self.monotonic()
                if progress or refusals == 1 or now - logged_at >= HOLD_LOG_EVERY_S:
                    # A hold may last the consumer timeout: one line a minute, not one a try.
                    logged_at = now
                    _logger.warning(
                        "The %s report was not confirmed by the broker (%s)%s",
                        report.type,
                        exception_type_name(exc.__cause__ or exc),
                        ""
                        if progress
                        else f"; holding the delivery and retrying (try {refusals}, up to "
                        f"{max(0.0, give_up_at - now):.0f} s more)",
                        extra=self._log_extra(),
                    )
                if progress:
                    return False
                # The last wait is cut short, so that the last try runs at the hold's end; when
                # no try fits any more, the wait runs out the hold and the loop gives up above.
                wait_s = min(delay_s, give_up_at - now - LAST_TRY_MARGIN_S)
                if wait_s < 0:
                    wait_s = give_up_at - now
                await until(asyncio.sleep(wait_s), wait_s, self.delivery.cancel_token, self.abort)
                delay_s = min(delay_s * 2, PUBLISH_RETRY_MAX_S)
                continue
            if not confirmed:  # the wait ran out, or was stopped, before the confirm
                self.notify(PublishFailed(report.type))
                continue
            self.notify(ReportPublished(report.type))
            return True

    def _log_extra(self) -> dict[str, Any]:
        return task_log_extra({"task_id": self.task_id, "attempt": self.attempt})


async def until(work: Awaitable[None], limit_s: float, *tokens: CancelToken | None) -> bool:
    """Await ``work`` for at most ``limit_s`` seconds, or until a token is cancelled.

    Returns:
        ``True`` when ``work`` finished in time; ``False`` when it was cancelled first.

    Raises:
        Exception: whatever ``work`` raised.
    """
    running = asyncio.ensure_future(work)
    if limit_s <= 0:
        running.cancel()

    def stop() -> None:
        running.cancel()

    removers = [token.add_callback(stop) for token in tokens if token is not None]
    timer = asyncio.get_running_loop().call_later(max(0.0, limit_s), running.cancel)
    try:
        await asyncio.wait({running})
    except BaseException:
        running.cancel()  # our caller was cancelled: the work goes with it
        raise
    finally:
        timer.cancel()
        for remove in removers:
            remove()
    if running.cancelled():
        return False
    running.result()
    return True
