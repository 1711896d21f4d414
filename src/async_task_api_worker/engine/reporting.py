"""Publishing one delivery's reports, in order, each held until the broker confirms it.

``started`` is confirmed while the handler runs (:meth:`DeliveryReporter.begin_started`); the
terminal report follows it without waiting: one confirm round trip per task. A report goes out
once ``started`` is confirmed or on its way ahead of it; a terminal report whose ``started`` was
lost sends it again first. Each report (its tries too) is one ``send`` span, in its headers.
Reports are published in the calling task (``Transport.send``): a delivery's reports cost no
task of their own, only ``started``'s hold runs beside the handler.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

from async_task_api_worker.context import ProgressDropReason, ProgressUpdate, task_log_extra
from async_task_api_worker.engine import report_log
from async_task_api_worker.engine.decision import Reason
from async_task_api_worker.engine.hold import (
    HOLD_LOG_EVERY_S,
    LAST_TRY_MARGIN_S,
    PROGRESS_CONFIRM_WAIT_S,
    PUBLISH_RETRY_FIRST_S,
    PUBLISH_RETRY_MAX_S,
    abort_sparing_the_wire,
)
from async_task_api_worker.engine.waits import until
from async_task_api_worker.errors import PublishError, ReportEncodeError, ReportRefusedError
from async_task_api_worker.observability import tracing
from async_task_api_worker.ports import (
    CancelToken,
    Delivery,
    EngineEvent,
    ProgressDropped,
    PublishFailed,
    ReportPublished,
    Transport,
)
from async_task_api_worker.protocol.codes import ReportType
from async_task_api_worker.protocol.encoding import MAX_REPORT_BYTES
from async_task_api_worker.protocol.reports import (
    MAX_ERROR_MESSAGE_CHARS,
    EncodedReport,
    FailureReport,
    ProgressReport,
    ReportError,
    StartedReport,
    SuccessReport,
    encode_report,
    format_timestamp,
)

__all__ = ["DeliveryReporter"]


Placed = Callable[[], None] | None  # called once a report is on the wire


class _Started(Enum):
    """Where the ``started`` of ``begin_started`` is (``LOST``: refused behind a terminal)."""

    UNSENT, SENT, CONFIRMED, LOST = range(4)


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
    arrived_at: float = 0.0  # on ``monotonic``: when the delivery came (``inspect``'s elapsed)
    task_id: str | None = None
    client_id: str | None = None
    seq: int = 0
    gave_up: Reason | None = None
    #: Cancelled when ``started`` gives up with no terminal report behind it (the handler stops).
    started_gave_up: CancelToken = field(default_factory=CancelToken)
    #: Why the broker refused that ``started`` for its content, if it did (an engine error).
    started_error: ReportEncodeError | None = None
    _started: asyncio.Task[bool] | None = field(default=None, repr=False)
    _started_report: EncodedReport | None = field(default=None, repr=False)
    _started_state: _Started = field(default=_Started.UNSENT, repr=False)
    _started_moved: asyncio.Future[None] | None = field(default=None, repr=False)
    _taken_over: bool = field(default=False, repr=False)
    _last_timestamp: str = field(default="", repr=False)

    def _fields(self) -> dict[str, Any]:
        # Fixed-width text sorts as time: a clock stepped back repeats the last one ("Reports").
        self._last_timestamp = max(format_timestamp(self.wall_clock()), self._last_timestamp)
        return {
            "protocol_version": 1,
            "task_id": self.task_id,
            "client_id": self.client_id,
            "service": self.service,
            "attempt": self.attempt,
            "timestamp": self._last_timestamp,
        }

    def _encode(
        self, report: StartedReport | ProgressReport | SuccessReport | FailureReport
    ) -> EncodedReport:
        # The sequence number is taken in the order the engine asks: the wire's order too.
        encoded = encode_report(report, seq=self.seq, max_bytes=self.max_report_bytes)
        self.seq += 1
        return encoded

    async def publish_started(self) -> bool:
        """Publish ``started`` and wait for its confirm (for a face whose next step needs it)."""
        return await self._deliver(self._encode(StartedReport.model_construct(**self._fields())))

    def begin_started(self) -> None:
        """Publish ``started`` in the background, held as any report but ``progress`` is.

        Later reports of the delivery wait until it is confirmed (``progress``) or on the wire
        ahead of them (the terminal report, which then carries it: see the module). If it gives
        up first, :attr:`started_gave_up` is cancelled, and a report that waits for it is not
        sent (:attr:`gave_up` says why). Call on the event loop.
        """
        encoded = self._encode(StartedReport.model_construct(**self._fields()))
        self._started_report = encoded
        self._started = asyncio.ensure_future(self._hold_started(encoded))

    def end_started(self) -> None:
        """Stop holding ``started``: the delivery is settled without a terminal report."""
        if self._started is not None:
            self._started.cancel()  # a no-op once it is done

    async def publish_success(self, response: dict[str, Any]) -> bool:
        """Publish ``success``.

        Raises:
            ReportEncodeError: the response is not canonical JSON, or the report is larger than
                ``max_report_bytes`` or than the broker accepts (``too_large`` is then true), or
                the broker refused it for its content (``ReportRefusedError``).
        """
        report = SuccessReport.model_construct(**self._fields(), response=response)
        return await self._deliver(self._encode(report))

    async def publish_failure(self, code: str, message: str) -> bool:
        """Publish ``failure`` with ``code`` and ``message`` (cut to 1,024 characters)."""
        error = ReportError.model_construct(code=code, message=message[:MAX_ERROR_MESSAGE_CHARS])
        try:
            report = FailureReport.model_construct(**self._fields(), error=error)
            return await self._deliver(self._encode(report))
        except ReportEncodeError:  # only a broker whose size limit is below a small report
            self.gave_up = Reason.HOLD_EXPIRED
            return False

    async def publish_progress(self, update: ProgressUpdate) -> bool:
        """Publish ``progress``; a payload that cannot be encoded is dropped and counted."""
        payload = None if update.payload is None else dict(update.payload)
        report = ProgressReport.model_construct(
            **self._fields(), fraction=update.fraction, payload=payload
        )
        try:
            published = await self._deliver(self._encode(report))
        except ReportEncodeError:
            self.notify(ProgressDropped(ProgressDropReason.INVALID_PAYLOAD.value))
            return False
        if not published:
            self.notify(ProgressDropped(ProgressDropReason.PUBLISH_FAILED.value))
        return published

    async def _hold_started(self, encoded: EncodedReport) -> bool:
        try:
            confirmed = await self._deliver(encoded)
        except ReportEncodeError as exc:  # refused for its content: the engine's error
            self.started_error = exc
            self.gave_up = Reason.HOLD_EXPIRED
            confirmed = False
        if not confirmed and not self._taken_over:
            self.started_gave_up.cancel("the started report gave up")
        return confirmed

    def _mark(self, state: _Started) -> None:
        self._started_state = state
        moved, self._started_moved = self._started_moved, None
        if moved is not None and not moved.done():
            moved.set_result(None)

    async def _after_started(self, *, take_over: bool) -> bool:
        """Wait until ``started`` is confirmed, or (``take_over``) on the wire ahead.

        Returns ``False`` when it gave up: nothing may follow it.
        """
        started = self._started
        if started is None:
            return True
        while not started.done() and not (take_over and self._started_state is _Started.SENT):
            moved = self._started_moved = asyncio.get_running_loop().create_future()
            await asyncio.wait({started, moved}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            self._taken_over = True
            return True
        # Lost behind a terminal report (its channel closed): the next one carries it first.
        return not started.cancelled() and (started.result() or self._taken_over)

    def _stopped(self) -> Reason | None:
        if self.delivery.cancel_token.cancelled:
            return Reason.WITHDRAWN
        if self.abort is not None and self.abort.cancelled:
            return Reason.ABORTED
        return None

    async def _try(self, encoded: EncodedReport, *, carries_started: bool, placed: Placed) -> None:
        """Send ``encoded`` (after ``started`` again, when it carries a lost one); confirm it.

        A terminal report that went out behind a ``started`` still in flight also waits for
        that confirm: confirms come in order on a channel, so it is in, or about to be.
        """
        if carries_started and self._started_report is not None:
            await self._try_behind_started(encoded, self._started_report, placed)
            return
        is_started = encoded is self._started_report
        started = self._started if self._taken_over and not is_started else None
        try:
            await self.delivery.report(
                encoded,
                placed=functools.partial(self._mark, _Started.SENT) if is_started else placed,
            )
        except BaseException:
            if is_started:
                self._mark(_Started.UNSENT)
            raise
        finally:
            if started is not None and not started.done():
                await asyncio.wait({started})
        if is_started:
            self._mark(_Started.CONFIRMED)

    async def _try_behind_started(
        self, encoded: EncodedReport, started: EncodedReport, placed_after: Placed
    ) -> None:
        """Resend a lost ``started`` (a task, on this rare path), ``encoded`` once it is placed."""
        placed = asyncio.get_running_loop().create_future()
        ahead = asyncio.ensure_future(
            self.delivery.report(started, placed=lambda: _resolve(placed))
        )
        try:
            await asyncio.wait({ahead, placed}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            ahead.cancel()
            raise
        if not placed.done():  # failed before it took its place
            placed.cancel()
            await ahead  # raises why
        self._mark(_Started.SENT)
        refused: Exception | None = None
        try:
            await self.delivery.report(encoded, placed=placed_after)
        except Exception as exc:
            refused = exc
        except BaseException:
            ahead.cancel()
            self._mark(_Started.LOST)  # so that the next try sends it again
            raise
        (lost,) = await asyncio.gather(ahead, return_exceptions=True)
        self._mark(_Started.LOST if isinstance(lost, BaseException) else _Started.CONFIRMED)
        if refused is not None:
            raise refused

    async def _deliver(self, encoded: EncodedReport) -> bool:
        kind = encoded.type
        terminal = kind.terminal
        if kind is not ReportType.STARTED and not await self._after_started(take_over=terminal):
            return False  # ``started`` gave up (and said why): nothing may follow it
        give_up_at = self.hold_until
        if kind is ReportType.PROGRESS:
            give_up_at = min(give_up_at, self.monotonic() + PROGRESS_CONFIRM_WAIT_S)
        on_wire = [False]  # whether the report of the try under way is on the wire
        abort, forget = abort_sparing_the_wire(self.abort, on_wire, kind)
        with tracing.sending(self.transport, encoded.properties.message_id) as headers:
            encoded.properties.headers.update(headers)
            try:
                confirmed = await self._hold(encoded, give_up_at, abort, on_wire)
            finally:
                forget()
        if confirmed and terminal and self._started_state is _Started.LOST:
            report_log.started_lost(self._log_extra())
        return confirmed

    async def _hold(
        self,
        encoded: EncodedReport,
        give_up_at: float,
        abort: CancelToken | None,
        on_wire: list[bool],
    ) -> bool:
        """Try until confirmed; ``False`` when ``give_up_at`` or a token comes first."""
        kind = encoded.type
        progress = kind is ReportType.PROGRESS
        is_started = encoded is self._started_report
        terminal = kind.terminal
        delay_s = PUBLISH_RETRY_FIRST_S
        refusals, logged_at = 0, 0.0
        while True:
            if is_started and self._taken_over and self._started_state is not _Started.CONFIRMED:
                # Lost after the terminal report went out behind it: the terminal report sends
                # it again ahead of itself, never after.
                self._mark(_Started.LOST)
                return False
            why = self._stopped()
            if why is None and self.monotonic() >= give_up_at:
                why = Reason.HOLD_EXPIRED
            if why is not None:
                if not progress:
                    self._give_up(kind, why)
                return False
            on_wire[0] = False
            try:
                confirmed = await until(
                    self._try(
                        encoded,
                        carries_started=terminal and self._started_state is _Started.LOST,
                        placed=functools.partial(on_wire.__setitem__, 0, True),
                    ),
                    give_up_at - self.monotonic(),
                    self.delivery.cancel_token,
                    abort,
                )
            except ReportRefusedError as exc:
                # Refused for what it holds (its size, Step Functions' InvalidOutput): trying
                # again cannot help, and the task concludes with the failure this becomes.
                self.notify(PublishFailed(kind))
                for_what = "for its size" if exc.too_large else "for its content"
                raise ReportEncodeError(
                    f"the broker refused the {kind} report of {len(encoded.body)} bytes "
                    f"{for_what} ({exc})",
                    too_large=exc.too_large,
                ) from exc
            except PublishError as exc:
                self.notify(PublishFailed(kind))
                if self._stopped() is not None or (is_started and self._taken_over):
                    continue  # said once, at the loop's top
                refusals += 1
                now = self.monotonic()
                if progress or refusals == 1 or now - logged_at >= HOLD_LOG_EVERY_S:
                    # A hold may last the consumer timeout: one line a minute, not one a try.
                    logged_at = now
                    report_log.refused(
                        kind,
                        exc,
                        None if progress else refusals,
                        give_up_at - now,
                        self._log_extra(),
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
                self.notify(PublishFailed(kind))
                continue
            self.notify(ReportPublished(kind))
            return True

    def _give_up(self, kind: ReportType, why: Reason) -> None:
        self.gave_up = why
        report_log.gave_up(kind, why.value, why is Reason.WITHDRAWN, self._log_extra())

    def _log_extra(self) -> dict[str, Any]:
        return task_log_extra({"task_id": self.task_id, "attempt": self.attempt})


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
