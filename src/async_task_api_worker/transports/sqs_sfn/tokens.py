"""One SQS + Step Functions delivery, and its task token: reports, heartbeats, staleness.

- **The task token is the delivery's reply address.** ``started`` and ``progress`` become
  heartbeats, ``success`` ``SendTaskSuccess`` and ``failure`` ``SendTaskFailure``
  (:mod:`.codec`). Beside them, a heartbeat goes every ``heartbeat_interval_s`` from pickup to
  release, from the event loop, which no handler blocks.
- **A stale token withdraws the delivery.** When Step Functions answers that it no longer
  waits on the token, the delivery's cancel token is cancelled: the engine stops the handler
  (a process-isolated task's group is killed) and nothing more is sent for it.
- **The message left SQS at pickup** (``requeueable`` false): the delivery has no ack, retry
  or reject; its give-back hands the task back to Step Functions as the error
  :data:`GIVEN_BACK_ERROR`, for the state machine's ``Retry``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final, TypeVar

from async_task_api_worker.errors import PublishError, SettleError
from async_task_api_worker.ports import Delivery
from async_task_api_worker.protocol.codes import ReportType
from async_task_api_worker.protocol.reports import EncodedReport
from async_task_api_worker.transports.sqs_sfn.aws import (
    QueueRefusedError,
    StaleTokenError,
    StepFunctionsApi,
)
from async_task_api_worker.transports.sqs_sfn.codec import ReadBody, failure_of, output_of
from async_task_api_worker.transports.sqs_sfn.receiving import FAILURE_LOG_EVERY_S

__all__ = ["GIVEN_BACK_ERROR", "SfnDelivery", "Tokens"]

_logger = logging.getLogger("async_task_api_worker.transports.sqs_sfn")

T = TypeVar("T")

#: The ``error`` a task handed back without a result gets (a drain that ran out of grace, a
#: report that could not get out, an executor that could not run it): not the task's failure,
#: so a state machine's ``Retry`` on it runs the task again.
GIVEN_BACK_ERROR: Final = "TASK_GIVEN_BACK"
_GIVEN_BACK_CAUSE: Final = (
    "the worker handed the task back without a result (it was stopping, or could not run or "
    "report it): not the task's failure; retry it"
)


class Tokens:
    """The Step Functions side of the transport's deliveries.

    Args:
        sfn: the Step Functions API.
        call: runs a blocking call on the transport's thread pool.
        keep: runs a coroutine to its end in the background (the transport's close waits).
        heartbeat_s: seconds between two heartbeats of a token.
        error_names: the ``error`` sent for a failure code a face names otherwise.
        stale_log_level: the level of the line a stale token writes.
        delete_again: deletes a message whose delete at pickup failed; ``False`` if it
            failed again.
        released: called once a delivery is released (it lets go of protection).
    """

    def __init__(
        self,
        sfn: StepFunctionsApi,
        *,
        call: Callable[[Callable[[], T]], Awaitable[T]],
        keep: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
        heartbeat_s: float,
        error_names: Mapping[str, str],
        stale_log_level: int,
        delete_again: Callable[[SfnDelivery], Awaitable[bool]],
        released: Callable[[SfnDelivery], Coroutine[Any, Any, None]],
    ) -> None:
        self._sfn = sfn
        self._call: Callable[[Callable[[], Any]], Awaitable[Any]] = call
        self.keep = keep
        self._heartbeat_s = heartbeat_s
        self._error_names = error_names
        self._stale_level = stale_log_level
        self._delete_again = delete_again
        self.released = released
        self._beats_failed = 0
        self._beat_logged_at: float | None = None

    async def publish(self, delivery: SfnDelivery, report: EncodedReport) -> None:
        """Send ``report`` to Step Functions (see the module); returns once it is taken.

        Raises:
            MessageTooLargeError: a ``success`` whose output is over 256 KiB.
            ReportRefusedError: Step Functions refused the output (``InvalidOutput``).
            PublishError: it did not go through; for a stale token, after withdrawing the
                delivery.
        """
        token = delivery.token
        if token is None:
            raise PublishError("the delivery has no task token to report to")
        if report.type in (ReportType.STARTED, ReportType.PROGRESS):
            call = functools.partial(self._sfn.heartbeat, token)
        elif report.type is ReportType.SUCCESS:
            call = functools.partial(self._sfn.succeed, token, output_of(report))
        else:
            error, cause = failure_of(report, self._error_names)
            call = functools.partial(self._sfn.fail, token, error, cause)
        try:
            await self._call(call)
        except StaleTokenError as exc:
            self.withdraw(delivery, exc, from_heartbeats=False)
            raise

    async def hand_back(self, token: str) -> None:
        """End ``token`` with :data:`GIVEN_BACK_ERROR` (a stale one is done already).

        Raises:
            SettleError: the failure could not be sent.
        """
        try:
            await self._call(
                functools.partial(self._sfn.fail, token, GIVEN_BACK_ERROR, _GIVEN_BACK_CAUSE)
            )
        except StaleTokenError:
            return  # Step Functions has moved on already
        except PublishError as exc:
            raise SettleError(f"the task could not be handed back ({exc})") from exc

    async def beat_every(self, delivery: SfnDelivery, token: str) -> None:
        """Heartbeat ``token`` until cancelled or stale (and delete a message not deleted)."""
        while True:
            await asyncio.sleep(self._heartbeat_s)
            if not delivery.deleted:  # SQS would bring it back: keep trying, beside the beats
                with contextlib.suppress(QueueRefusedError):
                    delivery.deleted = await self._delete_again(delivery)
            try:
                await self._call(functools.partial(self._sfn.heartbeat, token))
            except StaleTokenError as exc:
                self.withdraw(delivery, exc, from_heartbeats=True)
                return
            except PublishError as exc:
                # Throttling, a 5xx, the network: the next beat may go through; never a kill.
                self._heartbeat_failed(exc, delivery)

    def _heartbeat_failed(self, exc: PublishError, delivery: SfnDelivery) -> None:
        self._beats_failed += 1
        now = asyncio.get_running_loop().time()
        if self._beat_logged_at is None or now - self._beat_logged_at >= FAILURE_LOG_EVERY_S:
            # An outage fails every task's beats: one line a minute, not one a beat.
            self._beat_logged_at = now
            _logger.warning(
                "A heartbeat did not go through (%s; %d failed so far)",
                exc,
                self._beats_failed,
                extra={"task_id": delivery.message_id},
            )

    def withdraw(
        self, delivery: SfnDelivery, exc: StaleTokenError, *, from_heartbeats: bool
    ) -> None:
        """The token went stale: stop the beats and cancel the delivery's cancel token."""
        if delivery.cancel_token.cancelled:
            return
        _logger.log(
            self._stale_level,
            "The task token went stale (%s): the delivery is withdrawn, its handler (if it "
            "runs) is stopped, and nothing more is sent for it",
            exc.aws_code,
            extra={"task_id": delivery.message_id},
        )
        if not from_heartbeats:
            delivery.stop_heartbeats()
        delivery.cancel_token.cancel("stale task token")


class SfnDelivery(Delivery):
    """An SQS message deleted at pickup, its task token the reply address.

    Attributes:
        message_id: the SQS message id (the task id).
        receipt: its receipt handle.
        token: the task token, or ``None`` when the body had no usable one (nobody to tell).
        deleted: whether its delete went through (else it is tried again with each beat).
    """

    __slots__ = ("_tokens", "deleted", "heartbeats", "message_id", "receipt", "released", "token")

    def __init__(
        self,
        read: ReadBody,
        tokens: Tokens,
        *,
        headers: Mapping[str, Any],
        message_id: str,
        receipt: str,
        deleted: bool,
    ) -> None:
        envelope = read.envelope if read.envelope is not None else read.error
        assert envelope is not None  # noqa: S101 - read_body sets one or the other
        super().__init__(envelope, headers=headers, requeueable=False)
        self._tokens = tokens
        self.message_id = message_id
        self.receipt = receipt
        self.token = read.token
        self.deleted = deleted
        self.heartbeats: asyncio.Task[None] | None = None
        self.released = False
        if read.token is not None:
            self.heartbeats = asyncio.ensure_future(tokens.beat_every(self, read.token))

    async def report(
        self, report: EncodedReport, *, placed: Callable[[], None] | None = None
    ) -> None:
        """:meth:`Tokens.publish`; placed once taken (an API call cannot overlap the next)."""
        await self._tokens.publish(self, report)
        if placed is not None:
            placed()

    async def give_back(self) -> None:
        """Hand the task back to Step Functions: ``SendTaskFailure`` with ``TASK_GIVEN_BACK``.

        The message cannot go back to SQS (it was deleted at pickup); the state machine's
        ``Retry`` is where another attempt comes from.

        Raises:
            SettleError: the failure could not be sent.
        """
        if self.token is not None:
            # Finished even if its awaiter is cancelled (the port's rule for settles).
            await asyncio.shield(self._tokens.keep(self._tokens.hand_back(self.token)))

    async def release(self) -> None:
        """Stop the heartbeats and let go of the delivery's share of ECS task protection."""
        if self.released:
            return
        self.released = True
        self.stop_heartbeats()
        # Finished even if its awaiter is cancelled (the port's rule for a release).
        await asyncio.shield(self._tokens.keep(self._tokens.released(self)))

    def stop_heartbeats(self) -> None:
        """Cancel the heartbeats, if they run."""
        if self.heartbeats is not None and not self.heartbeats.done():
            self.heartbeats.cancel()
