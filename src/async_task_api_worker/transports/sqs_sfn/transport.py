"""The SQS + Step Functions transport: a delivery is an SQS message, its reply address a token.

Seed 000's invariants, kept here so that the engine runs unchanged:

- **Step Functions is the only retry source.** A message is deleted as soon as it is picked up,
  once ECS task protection is held (:class:`~.protection.ProtectionLease`); so every delivery
  is its task's one attempt (``requeueable`` false), and a give-back hands the task back to
  Step Functions as the error :data:`~.tokens.GIVEN_BACK_ERROR`.
- **The task token is the delivery's reply address** (:mod:`.tokens`: the reports, the
  heartbeats, a stale token's withdrawal).
- **Protection wraps the handling.** It is held from pickup until the delivery is released,
  after its settle.

boto3 is imported by :mod:`.aws` alone; its calls block, so they run on a small thread pool of
the transport's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from async_task_api_worker.errors import (
    PublishError,
    SettleError,
)
from async_task_api_worker.observability.redaction import exception_type_name
from async_task_api_worker.ports import Delivery, Observer
from async_task_api_worker.transports.sqs_sfn.aws import (
    QueueRefusedError,
    SqsApi,
    StepFunctionsApi,
    make_clients,
)
from async_task_api_worker.transports.sqs_sfn.codec import read_body, trace_headers
from async_task_api_worker.transports.sqs_sfn.protection import ProtectionLease, TaskProtection
from async_task_api_worker.transports.sqs_sfn.receiving import Receiver, delete, reach
from async_task_api_worker.transports.sqs_sfn.threads import DaemonPool
from async_task_api_worker.transports.sqs_sfn.tokens import SfnDelivery, Tokens

__all__ = ["SqsSfnTransport"]

_logger = logging.getLogger("async_task_api_worker.transports.sqs_sfn")

T = TypeVar("T")


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
        self._lease: ProtectionLease | None = None
        self._tokens: Tokens | None = None
        self._in_hand: set[SfnDelivery] = set()
        self._tokens_in_hand: set[str] = set()
        self._receiver: Receiver | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._picking: tuple[Mapping[str, Any], asyncio.Future[SfnDelivery | None]] | None = None
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
    def holding(self) -> bool:
        """Whether the last receive went through, if any (a drain included).

        A message handed in by ``sfn.Worker.handle_message``, with no receive of the
        transport's own, is held too.
        """
        return self._receiver is None or self._receiver.ok

    @property
    def consuming(self) -> bool:
        """Whether the poll loop runs and its last receive went through (readiness)."""
        return self._connected and self.holding and not self._stopping

    @property
    def publishing_blocked(self) -> bool:
        """Never: a report Step Functions does not take is held and tried again."""
        return False

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop_consuming` (or :meth:`close`) was called."""
        return self._stopping

    # ------------------------------------------------------------------ life

    async def _call(self, function: Callable[[], T]) -> T:
        if self._closed:
            raise PublishError("the SQS + Step Functions transport is closed")
        return await asyncio.get_running_loop().run_in_executor(self._pool, function)

    def _ensure_clients(self) -> tuple[SqsApi, Tokens, ProtectionLease]:
        if self._sqs is None or self._tokens is None or self._lease is None:
            sqs, sfn = make_clients(*self._clients, queue_url=self._queue_url)
            self._sqs = SqsApi(sqs, self._queue_url)
            self._tokens = Tokens(
                StepFunctionsApi(sfn),
                call=self._call,
                keep=self._keep,
                heartbeat_s=self._heartbeat_s,
                error_names=self._error_names,
                stale_log_level=self._stale_level,
                delete_again=self._delete_again,
                released=self._let_go,
            )
            protection = self._protection if self._protection is not None else TaskProtection()
            self._lease = ProtectionLease(protection, self._protection_minutes, self._call)
        return self._sqs, self._tokens, self._lease

    def observe(self, observer: Observer) -> None:
        """Nothing to tell: this broker never cancels a consumer (``Transport.observe``)."""

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
        await reach(self._call, sqs, self._queue_url, self._connect_timeout_s)
        self._connected = True
        _logger.info("Polling %s (Step Functions task tokens)", self._queue_url)

    async def stop_consuming(self) -> list[SfnDelivery]:
        """Stop receiving; the deliveries in hand are still reported and released.

        Returns:
            The message being picked up when the stop came, once picked up (a pick-up is not
            cut in half: its delete may be on its way): the caller gives it back through the
            engine, which hands its task back to Step Functions.
        """
        self._stopping = True
        self._stop_requested.set()
        self._changed.set()
        picking, self._picking = self._picking, None
        if picking is None:
            return []
        message, pick = picking
        try:
            delivery = await asyncio.shield(pick)
        except asyncio.CancelledError:
            self._keep(self._give_back_picked(message, pick))
            raise
        return [] if delivery is None else [delivery]

    async def close(self) -> None:
        """Stop the heartbeats and release ECS task protection; idempotent."""
        if self._closed:
            return
        self._stopping = True
        self._stop_requested.set()
        self._changed.set()
        for delivery in list(self._in_hand):
            delivery.stop_heartbeats()
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

    async def deliveries(self) -> AsyncIterator[SfnDelivery]:
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
                    self._picking = (message, picking)
                    try:
                        delivery = await asyncio.shield(picking)
                    except asyncio.CancelledError:
                        if self._picking is not None and self._picking[1] is picking:
                            self._picking = None  # no stop took it: it goes back from here
                            self._keep(self._give_back_picked(message, picking))
                        raise
                    if self._picking is None or self._picking[1] is not picking:
                        break  # a stop took it, to be given back through the engine
                    self._picking = None
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
        self, message: Mapping[str, Any], picking: asyncio.Future[SfnDelivery | None]
    ) -> None:
        # The consumer was cut mid-pickup without a stop to hand the delivery to (or the stop
        # itself was cut): the message may be deleted already (or soon: the delete cannot be
        # stopped), so its token goes back to Step Functions at once, without waiting for the
        # delete. A copy SQS brings back carries a stale token then. No engine is at hand to
        # write a decision line: the task was never started.
        token = read_body(
            str(message.get("Body", "")).encode("utf-8", "surrogatepass"),
            message_id=str(message.get("MessageId", "")),
            service=self._service,
            keep_token=self._keep_token,
            max_body_bytes=self._max_body_bytes,
        ).token
        _, tokens, _ = self._ensure_clients()
        if token is not None:
            with contextlib.suppress(SettleError):
                await tokens.hand_back(token)
        with contextlib.suppress(Exception):
            delivery = await picking
            if delivery is not None:
                await delivery.release()

    async def pick_up(self, message: Mapping[str, Any]) -> SfnDelivery | None:
        """Protect, delete and read one received SQS message (seed 000: protect, delete, run).

        Args:
            message: as ``ReceiveMessage`` returns it (``MessageId``, ``ReceiptHandle``,
                ``Body``).

        Returns:
            The delivery, in hand until its release, its heartbeats started; ``None`` for
            a message whose task this worker has in hand already (SQS brought it back because
            its delete had failed): it is deleted again, not run twice.

        Raises:
            QueueRefusedError: SQS refuses deletes for good (the message is handed back).
        """
        sqs, tokens, lease = self._ensure_clients()
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
            await delete(self._call, sqs, receipt, message_id)
            return None
        await lease.acquire()
        try:
            deleted = await delete(self._call, sqs, receipt, message_id)
        except QueueRefusedError:
            await lease.release()
            with contextlib.suppress(SettleError):
                await self._call(functools.partial(sqs.make_visible, receipt))
            raise
        delivery = SfnDelivery(
            read,
            tokens,
            headers=trace_headers(message),
            message_id=message_id,
            receipt=receipt,
            deleted=deleted,
        )
        self._in_hand.add(delivery)
        if read.token is not None:
            self._tokens_in_hand.add(read.token)
        return delivery

    def span_attributes(self, delivery: Delivery | None) -> Mapping[str, str | int]:
        """The SQS queue (by the last part of its URL), or (``None``) Step Functions."""
        if delivery is None:
            return {"messaging.system": "aws_stepfunctions", "messaging.destination.name": "task"}
        return {
            "messaging.system": "aws_sqs",
            "messaging.destination.name": self._queue_url.rstrip("/").rpartition("/")[2],
        }

    async def _delete_again(self, delivery: SfnDelivery) -> bool:
        sqs, _, _ = self._ensure_clients()
        return await delete(self._call, sqs, delivery.receipt, delivery.message_id, again=True)

    async def _let_go(self, delivery: SfnDelivery) -> None:
        """A delivery's release: out of hand, deleted if it was not, its protection let go."""
        self._in_hand.discard(delivery)
        if delivery.token is not None:
            self._tokens_in_hand.discard(delivery.token)
        if not delivery.deleted and self._sqs is not None and not self._closed:
            with contextlib.suppress(QueueRefusedError):
                delivery.deleted = await self._delete_again(delivery)
        self._changed.set()
        if self._lease is not None:
            try:
                await self._lease.release()
            except Exception as exc:  # the protection client never raises; an adapter bug
                _logger.error("Releasing task protection failed (%s)", exception_type_name(exc))
