"""The SQS + Step Functions transport: a delivery is an SQS message, its reply address a token.

Seed 000's invariants, kept here so that the engine runs unchanged:

- **Step Functions is the only retry source.** A message is deleted as soon as it is picked up,
  once ECS task protection is held (:class:`~.protection.ProtectionLease`); so the transport
  deletes on pickup (``deletes_on_pickup``): every delivery is its task's one attempt, and a
  requeue hands the task back to Step Functions as the error :data:`GIVEN_BACK_ERROR`.
- **The task token is the delivery's reply address.** ``started`` and ``progress`` become
  heartbeats, ``success`` ``SendTaskSuccess`` and ``failure`` ``SendTaskFailure``
  (:mod:`.codec`). Beside them, a heartbeat goes every ``heartbeat_interval_s`` from pickup to
  release, from the event loop, which no handler blocks.
- **A stale token withdraws the delivery.** When Step Functions answers that it no longer
  waits on the token, the delivery's cancel token is cancelled: the engine stops the handler
  (a process-isolated task's group is killed) and nothing more is sent for it.
- **Protection wraps the handling.** It is held from pickup until the delivery is released,
  after its settle.

boto3 is imported by :mod:`._aws` alone; its calls block, so they run on a small thread pool of
the transport's own. The module is over 400 lines: pickup, heartbeats, withdrawal and the
reports share one delivery's state (its token, its heartbeats, its share of protection), and
read best in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from async_task_api_worker.errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    PublishError,
    SettleError,
    TransportError,
)
from async_task_api_worker.observability.redaction import exception_type_name
from async_task_api_worker.ports import Delivery
from async_task_api_worker.protocol.codes import ReportType
from async_task_api_worker.protocol.envelope import Envelope
from async_task_api_worker.protocol.reports import EncodedReport
from async_task_api_worker.transports.sqs_sfn._aws import (
    QueueRefusedError,
    SqsApi,
    StaleTokenError,
    StepFunctionsApi,
    make_clients,
)
from async_task_api_worker.transports.sqs_sfn.codec import (
    ReadBody,
    failure_of,
    output_of,
    read_body,
)
from async_task_api_worker.transports.sqs_sfn.protection import ProtectionLease, TaskProtection
from async_task_api_worker.transports.sqs_sfn.receiving import FAILURE_LOG_EVERY_S, Receiver
from async_task_api_worker.transports.sqs_sfn.threads import DaemonPool

__all__ = ["GIVEN_BACK_ERROR", "SqsSfnTransport"]

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
#: The longest wait between two tries to reach SQS at start, in seconds.
CONNECT_BACKOFF_MAX_S: Final = 30.0


@dataclass(slots=True, eq=False)
class _Handle:
    """The transport's side of a delivery (``Delivery.handle``)."""

    message_id: str
    read: ReadBody
    receipt: str = ""
    deleted: bool = True
    heartbeats: asyncio.Task[None] | None = None
    released: bool = False


class SqsSfnTransport:
    """A :class:`~async_task_api_worker.ports.Transport` on SQS and Step Functions.

    Args:
        queue_url: the SQS queue the ``waitForTaskToken`` state sends to (``SQS_QUEUE_URL``).
        service: the worker's name, the envelopes' ``service``.
        prefetch: the most messages in hand at once (``WORKER_CONCURRENCY``; 1 in job mode):
            no message is received, so deleted, before a slot is free for it.
        heartbeat_interval_s: seconds between two heartbeats of a token.
        protection_minutes: minutes of ECS task protection asked at a time.
        wait_time_s: the SQS long poll, in seconds (how long an idle stop may wait).
        max_body_bytes: the largest body accepted (``WORKER_MAX_MESSAGE_BYTES``).
        keep_token_in_input: keep ``task_token`` in the task input (seed 000's
            ``request_schema`` declares it); otherwise it is removed before validation.
        error_names: the ``error`` sent for a failure code a face names otherwise
            (``codec.failure_of``).
        stale_log_level: the level of the line a stale token writes.
        sqs_client, stepfunctions_client: boto3 clients; default: from the environment.
        protection: the ECS agent's endpoint; default: ``$ECS_AGENT_URI``.
        connect_timeout_s: give up reaching SQS at start after this long (``None``: never).
    """

    def __init__(
        self,
        *,
        queue_url: str,
        service: str,
        prefetch: int,
        heartbeat_interval_s: float,
        protection_minutes: int,
        wait_time_s: int = 5,
        max_body_bytes: int = 16 * 1024 * 1024,
        keep_token_in_input: bool = False,
        error_names: Mapping[str, str] | None = None,
        stale_log_level: int = logging.WARNING,
        sqs_client: Any = None,
        stepfunctions_client: Any = None,
        protection: TaskProtection | None = None,
        connect_timeout_s: float | None = None,
    ) -> None:
        self._queue_url = queue_url
        self._service = service
        self._prefetch = max(1, prefetch)
        self._heartbeat_s = heartbeat_interval_s
        self._wait_s = wait_time_s
        self._max_body_bytes = max_body_bytes
        self._keep_token = keep_token_in_input
        self._error_names = dict(error_names or {})
        self._stale_level = stale_log_level
        self._clients = (sqs_client, stepfunctions_client)
        self._protection = protection
        self._protection_minutes = protection_minutes
        self._connect_timeout_s = connect_timeout_s
        # Room for each delivery's beat and report at once, a poll, and the give-backs.
        self._pool = DaemonPool(2 * self._prefetch + 4, "sqs-sfn")
        self._sqs: SqsApi | None = None
        self._sfn: StepFunctionsApi | None = None
        self._lease: ProtectionLease | None = None
        self._in_hand: set[Delivery] = set()
        self._tokens_in_hand: set[str] = set()
        self._receiver: Receiver | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._beats_failed = 0
        self._beat_logged_at: float | None = None
        # Made now, so that a configuration AWS refuses (no region, a bad endpoint) is found
        # before anything runs, by `check` too.
        self._ensure_clients()
        self._changed = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._stopping = False
        self._connected = False
        self._closed = False

    # ------------------------------------------------------------------ what the engine reads

    @property
    def delivery_count_known(self) -> bool:
        """Always: every delivery is a first one (SQS redelivers nothing once deleted)."""
        return True

    @property
    def consuming(self) -> bool:
        """Whether the poll loop runs and its last receive went through (readiness)."""
        receiving_ok = self._receiver is None or self._receiver.ok
        return self._connected and not self._stopping and receiving_ok

    @property
    def publishing_blocked(self) -> bool:
        """Never: a report Step Functions does not take is held and tried again."""
        return False

    @property
    def deletes_on_pickup(self) -> bool:
        """Always: Step Functions is the only retry source (seed 000, invariants 1 and 2)."""
        return True

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop_consuming` (or :meth:`close`) was called."""
        return self._stopping

    # ------------------------------------------------------------------ life

    async def _call(self, function: Callable[[], T]) -> T:
        if self._closed:
            raise PublishError("the SQS + Step Functions transport is closed")
        return await asyncio.get_running_loop().run_in_executor(self._pool, function)

    def _ensure_clients(self) -> tuple[SqsApi, StepFunctionsApi, ProtectionLease]:
        if self._sqs is None or self._sfn is None or self._lease is None:
            sqs, sfn = make_clients(*self._clients, queue_url=self._queue_url)
            self._sqs, self._sfn = SqsApi(sqs, self._queue_url), StepFunctionsApi(sfn)
            protection = self._protection if self._protection is not None else TaskProtection()
            self._lease = ProtectionLease(protection, self._protection_minutes, self._call)
        return self._sqs, self._sfn, self._lease

    def listen_for_cancels(self, handler: Callable[[bytes], object]) -> bool:
        """No cancel reaches this face: Step Functions stops an execution itself (docs/sfn.md)."""
        return False

    async def connect(self) -> None:
        """Make the clients and check the queue, trying again with a backoff capped at 30 s.

        Raises:
            BrokerRefusedError: the queue does not exist, or AWS refuses the credentials.
            BrokerUnavailableError: SQS could not be reached within ``connect_timeout_s``.
        """
        sqs, _, _ = self._ensure_clients()
        loop = asyncio.get_running_loop()
        started = loop.time()
        delay_s = 1.0
        while True:
            try:
                await self._call(sqs.check)
            except BrokerRefusedError:
                raise
            except TransportError as exc:
                waited = loop.time() - started
                if self._connect_timeout_s is not None and waited >= self._connect_timeout_s:
                    raise BrokerUnavailableError(
                        f"SQS could not be reached within {self._connect_timeout_s:g} s ({exc})"
                    ) from exc
                _logger.warning(
                    "%s (SQS_QUEUE_URL %s); trying again in %g s", exc, self._queue_url, delay_s
                )
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, CONNECT_BACKOFF_MAX_S)
                continue
            break
        self._connected = True
        _logger.info("Polling %s (Step Functions task tokens)", self._queue_url)

    async def stop_consuming(self) -> None:
        """Stop receiving; the deliveries in hand are still reported and released."""
        self._stopping = True
        self._stop_requested.set()
        self._changed.set()

    async def close(self) -> None:
        """Stop the heartbeats and release ECS task protection; idempotent."""
        if self._closed:
            return
        self._stopping = True
        self._stop_requested.set()
        self._changed.set()
        for delivery in list(self._in_hand):
            self._stop_heartbeats(delivery.handle)
        # A poll still in flight ends within SQS_WAIT_TIME_S: its messages go back to the
        # queue, and what a stop left mid-pickup goes back to Step Functions, before the pool.
        # Within what the runner gives a close (runtime.hooks.close_timeout_s).
        if self._background:
            await asyncio.wait(set(self._background), timeout=2.0)
        if self._receiver is not None:
            await self._receiver.finish(self._wait_s + 0.5)
        if self._lease is not None:
            await self._lease.close()  # its last call still goes through the pool
        self._closed = True
        self._pool.shutdown()

    # ------------------------------------------------------------------ deliveries

    async def deliveries(self) -> AsyncIterator[Delivery]:
        """Receive messages while a slot is free, and hand each out once picked up.

        A stop never strands a message: one mid-pickup is picked up to the end and handed back
        to Step Functions (``TASK_GIVEN_BACK``), the rest of its batch back to the queue.

        Raises:
            QueueRefusedError: SQS refuses the queue, or deletes from it, for good: every
                message would run again, so the worker stops (exit 1).
        """
        sqs, _, _ = self._ensure_clients()
        receiver = self._receiver_for(sqs)
        while not self._stopping:
            free = self._prefetch - len(self._in_hand)
            if free <= 0:
                self._changed.clear()
                await self._changed.wait()
                continue
            batch = list(await receiver.receive(free))
            try:
                while batch:
                    if self.stopping:  # asked during the poll: nothing more is taken
                        break
                    message = batch.pop(0)
                    picking = asyncio.ensure_future(self.pick_up(message))
                    try:
                        delivery = await asyncio.shield(picking)
                    except asyncio.CancelledError:
                        self._keep(self._give_back_picked(message, picking))
                        raise
                    if delivery is not None:
                        yield delivery
            finally:
                if batch:  # a stop, or the consumer went away, with messages not picked up
                    self._keep(receiver.hand_back(batch))

    def _receiver_for(self, sqs: SqsApi) -> Receiver:
        if self._receiver is None:
            self._receiver = Receiver(sqs, self._pool, self._wait_s, self._stop_requested)
        return self._receiver

    def _keep(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` to its end in the background; :meth:`close` waits for it."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _give_back_picked(
        self, message: Mapping[str, Any], picking: asyncio.Future[Delivery | None]
    ) -> None:
        # The consumer was stopped mid-pickup: the message may be deleted already (or soon:
        # the delete cannot be stopped), so its token goes back to Step Functions at once,
        # without waiting for the delete. A copy SQS brings back carries a stale token then.
        token = read_body(
            str(message.get("Body", "")).encode("utf-8", "surrogatepass"),
            message_id=str(message.get("MessageId", "")),
            service=self._service,
            keep_token=self._keep_token,
            max_body_bytes=self._max_body_bytes,
        ).token
        if token is not None:
            with contextlib.suppress(SettleError):
                await self._hand_back_token(token)
        with contextlib.suppress(Exception):
            delivery = await picking
            if delivery is not None:
                await self.release(delivery)

    async def pick_up(self, message: Mapping[str, Any]) -> Delivery | None:
        """Protect, delete and read one received SQS message (seed 000: protect, delete, run).

        Args:
            message: as ``ReceiveMessage`` returns it (``MessageId``, ``ReceiptHandle``,
                ``Body``).

        Returns:
            The delivery, in hand until :meth:`release`, its heartbeats started; ``None`` for
            a message whose task this worker has in hand already (SQS brought it back because
            its delete had failed): it is deleted again, not run twice.

        Raises:
            QueueRefusedError: SQS refuses deletes for good (the message is handed back).
        """
        sqs, _, lease = self._ensure_clients()
        body = str(message.get("Body", "")).encode("utf-8", "surrogatepass")
        message_id = str(message.get("MessageId", ""))
        receipt = str(message.get("ReceiptHandle", ""))
        read = read_body(
            body,
            message_id=message_id,
            service=self._service,
            keep_token=self._keep_token,
            max_body_bytes=self._max_body_bytes,
        )
        if read.token is not None and read.token in self._tokens_in_hand:
            _logger.warning(
                "SQS brought back a message whose task is in hand (its delete had failed); "
                "deleting it again, not running it twice",
                extra={"task_id": message_id},
            )
            await self._delete(sqs, receipt, message_id)
            return None
        await lease.acquire()
        try:
            deleted = await self._delete(sqs, receipt, message_id)
        except QueueRefusedError:
            await lease.release()
            with contextlib.suppress(SettleError):
                await self._call(functools.partial(sqs.make_visible, receipt))
            raise
        handle = _Handle(message_id, read, receipt=receipt, deleted=deleted)
        delivery = Delivery(
            body=body,
            headers=_trace_headers(message),
            delivery_count=0,
            redelivered=False,
            handle=handle,
        )
        self._in_hand.add(delivery)
        if read.token is not None:
            self._tokens_in_hand.add(read.token)
            handle.heartbeats = asyncio.ensure_future(self._beat_every(delivery, read.token))
        return delivery

    async def _delete(
        self, sqs: SqsApi, receipt: str, message_id: str, *, again: bool = False
    ) -> bool:
        """Delete a message; ``False`` (logged) when it did not go through for now.

        ``again``: a retry, logged at DEBUG (the first failure said it at WARNING).
        """
        try:
            await self._call(functools.partial(sqs.delete, receipt))
        except SettleError as exc:
            _logger.log(
                logging.DEBUG if again else logging.WARNING,
                "Could not delete the message (%s); trying again with each heartbeat",
                exc,
                extra={"task_id": message_id},
            )
            return False
        return True

    def span_attributes(self, delivery: Delivery | None) -> Mapping[str, str | int]:
        """The SQS queue (by the last part of its URL), or (``None``) Step Functions."""
        if delivery is None:
            return {"messaging.system": "aws_stepfunctions", "messaging.destination.name": "task"}
        return {
            "messaging.system": "aws_sqs",
            "messaging.destination.name": self._queue_url.rstrip("/").rpartition("/")[2],
        }

    def envelope(self, delivery: Delivery, *, max_body_bytes: int) -> Envelope:
        """The envelope read at pickup (``codec.read_body``, with the transport's own limit).

        Raises:
            EnvelopeDecodeError: the body was refused.
        """
        read = _handle(delivery).read
        if read.envelope is None:
            assert read.error is not None  # noqa: S101 - read_body sets one or the other
            raise read.error
        return read.envelope

    # ------------------------------------------------------------------ heartbeats

    async def _beat_every(self, delivery: Delivery, token: str) -> None:
        sqs, sfn, _ = self._ensure_clients()
        handle = _handle(delivery)
        while True:
            await asyncio.sleep(self._heartbeat_s)
            if not handle.deleted:  # SQS would bring it back: keep trying, beside the beats
                with contextlib.suppress(QueueRefusedError):
                    handle.deleted = await self._delete(
                        sqs, handle.receipt, handle.message_id, again=True
                    )
            try:
                await self._call(functools.partial(sfn.heartbeat, token))
            except StaleTokenError as exc:
                self._withdraw(delivery, exc, from_heartbeats=True)
                return
            except PublishError as exc:
                # Throttling, a 5xx, the network: the next beat may go through; never a kill.
                self._heartbeat_failed(exc, delivery)

    def _heartbeat_failed(self, exc: PublishError, delivery: Delivery) -> None:
        self._beats_failed += 1
        now = asyncio.get_running_loop().time()
        if self._beat_logged_at is None or now - self._beat_logged_at >= FAILURE_LOG_EVERY_S:
            # An outage fails every task's beats: one line a minute, not one a beat.
            self._beat_logged_at = now
            _logger.warning(
                "A heartbeat did not go through (%s; %d failed so far)",
                exc,
                self._beats_failed,
                extra=_fields(delivery),
            )

    def _withdraw(self, delivery: Delivery, exc: StaleTokenError, *, from_heartbeats: bool) -> None:
        if delivery.cancel_token.cancelled:
            return
        _logger.log(
            self._stale_level,
            "The task token went stale (%s): the delivery is withdrawn, its handler (if it "
            "runs) is stopped, and nothing more is sent for it",
            exc.aws_code,
            extra=_fields(delivery),
        )
        if not from_heartbeats:
            self._stop_heartbeats(delivery.handle)
        delivery.cancel_token.cancel("stale task token")

    @staticmethod
    def _stop_heartbeats(handle: _Handle) -> None:
        if handle.heartbeats is not None and not handle.heartbeats.done():
            handle.heartbeats.cancel()

    # ------------------------------------------------------------------ reports

    async def send(
        self,
        delivery: Delivery,
        report: EncodedReport,
        *,
        placed: Callable[[], None] | None = None,
    ) -> None:
        """:meth:`publish`: an API call cannot overlap the next, so it is placed once taken."""
        await self.publish(delivery, report)
        if placed is not None:
            placed()

    async def publish(self, delivery: Delivery, report: EncodedReport) -> None:
        """Send ``report`` to Step Functions (see the module); returns once it is taken.

        Raises:
            MessageTooLargeError: a ``success`` whose output is over 256 KiB.
            ReportRefusedError: Step Functions refused the output (``InvalidOutput``).
            PublishError: it did not go through; for a stale token, after withdrawing the
                delivery.
        """
        handle = _handle(delivery)
        token = handle.read.token
        if token is None:
            raise PublishError("the delivery has no task token to report to")
        _, sfn, _ = self._ensure_clients()
        if report.type in (ReportType.STARTED, ReportType.PROGRESS):
            call = functools.partial(sfn.heartbeat, token)
        elif report.type is ReportType.SUCCESS:
            call = functools.partial(sfn.succeed, token, output_of(report))
        else:
            error, cause = failure_of(report, self._error_names)
            call = functools.partial(sfn.fail, token, error, cause)
        try:
            await self._call(call)
        except StaleTokenError as exc:
            self._withdraw(delivery, exc, from_heartbeats=False)
            raise

    async def ack(self, delivery: Delivery) -> None:
        """Nothing to send: the message was deleted at pickup, its token ended by the report."""
        return None

    async def reject(self, delivery: Delivery) -> None:
        """Nothing to send: a refused body without a task token has nobody to tell."""
        return None

    async def requeue(self, delivery: Delivery, *, count_attempt: bool) -> None:
        """Hand the task back to Step Functions: ``SendTaskFailure`` with ``TASK_GIVEN_BACK``.

        The message cannot go back to SQS (it was deleted at pickup); the state machine's
        ``Retry`` is where another attempt comes from.

        Raises:
            SettleError: the failure could not be sent.
        """
        token = _handle(delivery).read.token
        if token is not None:
            # Finished even if its awaiter is cancelled (the port's rule for settles).
            await asyncio.shield(self._keep(self._hand_back_token(token)))

    async def _hand_back_token(self, token: str) -> None:
        _, sfn, _ = self._ensure_clients()
        try:
            await self._call(
                functools.partial(sfn.fail, token, GIVEN_BACK_ERROR, _GIVEN_BACK_CAUSE)
            )
        except StaleTokenError:
            return  # Step Functions has moved on already
        except PublishError as exc:
            raise SettleError(f"the task could not be handed back ({exc})") from exc

    async def release(self, delivery: Delivery) -> None:
        """Stop the delivery's heartbeats and let go of its share of ECS task protection."""
        handle = _handle(delivery)
        if handle.released:
            return
        handle.released = True
        self._stop_heartbeats(handle)
        self._in_hand.discard(delivery)
        if handle.read.token is not None:
            self._tokens_in_hand.discard(handle.read.token)
        # Finished even if its awaiter is cancelled (the port's rule for a release).
        await asyncio.shield(self._keep(self._let_go(handle)))

    async def _let_go(self, handle: _Handle) -> None:
        if not handle.deleted and self._sqs is not None and not self._closed:
            with contextlib.suppress(QueueRefusedError):
                handle.deleted = await self._delete(
                    self._sqs, handle.receipt, handle.message_id, again=True
                )
        self._changed.set()
        if self._lease is not None:
            try:
                await self._lease.release()
            except Exception as exc:  # the protection client never raises; an adapter bug
                _logger.error("Releasing task protection failed (%s)", exception_type_name(exc))


def _handle(delivery: Delivery) -> _Handle:
    handle = delivery.handle
    if not isinstance(handle, _Handle):
        raise SettleError("not a delivery of this transport")
    return handle


def _fields(delivery: Delivery) -> dict[str, Any]:
    handle = delivery.handle
    return {"task_id": handle.message_id if isinstance(handle, _Handle) else None}


def _trace_headers(message: Mapping[str, Any]) -> dict[str, str]:
    """The ``traceparent`` and ``tracestate`` message attributes of an SQS message, if any."""
    attributes = message.get("MessageAttributes") or {}
    return {
        name: str(value["StringValue"])
        for name, value in attributes.items()
        if name in ("traceparent", "tracestate")
        and isinstance(value, Mapping)
        and "StringValue" in value
    }
