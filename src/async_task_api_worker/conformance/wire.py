"""The conformance kit's side of the broker: publish bodies, watch reports, borrow deliveries.

The kit is an ordinary AMQP client of the worker's two queues. It publishes envelopes (and
bodies that are not envelopes) to the input queue, consumes every report from the output
queue, and keys what it sees by task id. Two things it does that no producer does:

- **borrowing a delivery** (:meth:`Wire.borrow`): a consumer of the input queue at a higher
  priority (RabbitMQ's ``x-priority`` consumer argument) receives a task before the worker and
  gives it back (``basic.reject`` with requeue, which every RabbitMQ counts as a delivery;
  4.3 and later do not count ``basic.nack``) a chosen number of times, so that the worker's
  first sight of it carries a delivery count it never caused itself. The last give-back
  happens after the consumer is cancelled, so that the count is exact.
- **catching a requeue** (:meth:`Wire.catch_requeued`): the same kind of consumer, after a body
  was settled, takes whatever is still or again in the queue: a body settled for good never
  comes back.

Every report it reads is kept as it arrived, its number types kept
(``report_rules.Seen``), and held to the rules every report keeps, whatever the case
(:meth:`Wire.broken_rules`).

Run it against a service of its own: it consumes the output queue, and a borrowed or caught
message of another producer would be given back with its count raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractIncomingMessage,
    AbstractQueue,
)
from aio_pika.exceptions import AMQPError

from async_task_api_worker.conformance.report_rules import ReportRules, Seen, read_json
from async_task_api_worker.observability.redaction import redact_url
from async_task_api_worker.transports.rabbitmq.failures import (
    connect_failure,
    is_refusal,
    refused,
)
from async_task_api_worker.transports.rabbitmq.tls import tls_context, tls_failure
from async_task_api_worker.transports.rabbitmq.topology import queue_type

__all__ = ["BORROW_PRIORITY", "Seen", "Wire"]

#: The ``x-priority`` of the kit's consumers of the input queue: above any worker's (0 unless set).
BORROW_PRIORITY: Final = 1_000_000


def _read(message: AbstractIncomingMessage) -> Seen:
    stamp = message.timestamp
    return Seen(
        body=message.body,
        document=read_json(message.body),
        properties={
            "content_type": message.content_type,
            "content_encoding": message.content_encoding,
            "delivery_mode": int(message.delivery_mode) if message.delivery_mode else None,
            "message_id": message.message_id,
            "correlation_id": message.correlation_id,
            "type": message.type,
            # The AMQP client reads a value past the year 2106 as milliseconds and divides it:
            # what reads back with a fraction was not whole seconds.
            "timestamp": None if stamp is None else stamp.timestamp(),
            "app_id": message.app_id,
        },
        at=time.monotonic(),
    )


@dataclass
class Wire:
    """The kit's connection to one worker service's queues (see the module).

    Use :meth:`open`, then ``async with``; every wait is bounded by ``timeout_s``.
    """

    connection: AbstractConnection
    in_queue: str
    out_queue: str
    timeout_s: float
    in_queue_type: str = "unknown"
    _channel: AbstractChannel | None = None
    _out: AbstractQueue | None = None
    _reading: str | None = None
    _reports: dict[str | None, list[Seen]] = field(default_factory=lambda: defaultdict(list))
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _rules: ReportRules = field(default_factory=ReportRules)
    _unchecked: list[Seen] = field(default_factory=list)

    @classmethod
    async def open(cls, url: str, in_queue: str, out_queue: str, timeout_s: float) -> Wire:
        """Connect, check that both queues exist and that a worker consumes the input queue.

        Raises:
            ConnectionError: the broker cannot be reached, or refused the credentials, the vhost
                or the TLS handshake (the SDK's words for a refusal, ``failures.refused``, and
                for a TLS failure, ``tls.tls_failure``).
            SettingsError: an ``amqps://`` URL's TLS files cannot be used.
            LookupError: within ``timeout_s``, a queue did not come to exist, or nothing came
                to consume the input queue.
        """
        context = tls_context(url)  # the worker's own TLS rule (docs/tls.md)
        try:
            connection = await asyncio.wait_for(
                aio_pika.connect(url, ssl_context=context), timeout_s
            )
        except Exception as exc:
            if is_refusal(exc):
                raise ConnectionError(str(refused(exc, redact_url(url)))) from exc
            why = await tls_failure(exc, url, context, timeout_s)
            cause = f"TLS: {why}" if why is not None else connect_failure(exc)
            raise ConnectionError(f"cannot connect to the broker ({cause})") from exc
        wire = cls(connection, in_queue, out_queue, timeout_s)
        try:
            await wire._start()
        except BaseException:
            await wire.close()
            raise
        return wire

    async def _start(self) -> None:
        # A worker started just before the kit may not consume yet: wait for it, within the
        # timeout, and say what was missing at the end.
        deadline = time.monotonic() + self.timeout_s
        while (missing := await self._missing()) is not None:
            if time.monotonic() >= deadline:
                raise LookupError(f"{missing} after {self.timeout_s:.0f} s: is the worker running?")
            await asyncio.sleep(0.2)
        self.in_queue_type = await queue_type(self.connection, self.in_queue)
        # Reports are read on a channel of their own: a body the broker refuses for its size
        # closes the publishing channel, and must not stop the reading.
        reading = await self.connection.channel()
        await reading.set_qos(prefetch_count=1000)
        self._out = await reading.get_queue(self.out_queue)
        await self.resume_reports()
        self._channel = await self.connection.channel(publisher_confirms=True)

    async def _missing(self) -> str | None:
        """What the kit still lacks to start: a queue, or a consumer of the input queue."""
        for name in (self.in_queue, self.out_queue):
            probe = await self.connection.channel()
            try:
                declared = await probe.declare_queue(name, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                return f"queue {name!r} does not exist"
            finally:
                if not probe.is_closed:
                    await probe.close()
            if name == self.in_queue and not declared.declaration_result.consumer_count:
                return f"nothing consumes {name!r}"
            if name == self.out_queue and declared.declaration_result.consumer_count:
                raise LookupError(
                    f"{name!r} has a consumer already (another kit, a client?): the kit must be "
                    f"its only reader"
                )
        return None

    async def worker_gone(self) -> str | None:
        """Why the worker cannot be tested any more (the broker or its consumer gone), or None."""
        if self.connection.is_closed:
            return "the kit lost its connection to the broker"
        try:
            probe = await self.connection.channel()
        except Exception as exc:
            return f"the kit cannot open a channel ({type(exc).__name__})"
        try:
            declared = await probe.declare_queue(self.in_queue, passive=True)
        except Exception as exc:
            return f"{self.in_queue!r} cannot be read ({type(exc).__name__})"
        finally:
            if not probe.is_closed:
                await probe.close()
        if not declared.declaration_result.consumer_count:
            return f"nothing consumes {self.in_queue!r} any more: the worker stopped"
        return None

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        if not self.connection.is_closed:
            await self.connection.close()

    async def __aenter__(self) -> Wire:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _on_report(self, message: AbstractIncomingMessage) -> None:
        seen = _read(message)
        task_id = None if seen.document is None else seen.document.get("task_id")
        self._reports[task_id if isinstance(task_id, str) else None].append(seen)
        self._unchecked.append(seen)
        self._arrived.set()

    def reports(self, task_id: str) -> list[Seen]:
        """The reports of ``task_id`` so far, in their order of arrival."""
        return list(self._reports.get(task_id, ()))

    def broken_rules(self, service: str) -> list[str]:
        """What the reports read since the last call break of the rules every report keeps.

        ``service`` is the worker's own name. The rules are ``conformance.report_rules``'s; each
        is reported once a run.
        """
        unchecked, self._unchecked = self._unchecked, []
        return [problem for seen in unchecked for problem in self._rules.check(seen, service)]

    async def publish(
        self, body: bytes, *, message_id: str | None = None, headers: dict[str, Any] | None = None
    ) -> None:
        """Publish ``body`` to the input queue as a producer does (persistent, confirmed).

        ``headers``: AMQP headers, for a producer that sets what it must not (a forged
        ``x-delivery-count``).

        Raises:
            aio_pika.exceptions.DeliveryError: the broker refused it (too large, a full queue).
        """
        if self._channel is None:
            raise RuntimeError("Wire.open() was not awaited")
        self._rules.sent(body)  # what the task's reports must echo
        message = aio_pika.Message(
            body,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=message_id,
            headers=headers,
        )
        await self._channel.default_exchange.publish(message, routing_key=self.in_queue)

    async def pause_reports(self) -> None:
        """Stop consuming the output queue, so that what is published there stays there."""
        if self._out is not None and self._reading is not None:
            await self._out.cancel(self._reading)
            self._reading = None

    async def resume_reports(self) -> None:
        """Consume the output queue again (what waited there arrives first)."""
        if self._out is not None and self._reading is None:
            self._reading = await self._out.consume(self._on_report, no_ack=True)

    async def ready(self, queue: str | None = None) -> int:
        """The messages ready for delivery in ``queue`` (default: the input queue).

        Read from AMQP's ``queue.declare-ok`` (a passive declare), which consumes nothing.
        """
        channel = await self.connection.channel()
        try:
            declared = await channel.declare_queue(queue or self.in_queue, passive=True)
            return int(declared.declaration_result.message_count or 0)
        finally:
            await channel.close()

    async def try_publish(self, body: bytes, *, message_id: str | None = None) -> str | None:
        """Publish as :meth:`publish` does; ``None`` when the broker took it, else why not.

        A body over the broker's ``max_message_size`` closes the publishing channel: it is
        opened again, so that the kit can go on.
        """
        try:
            await self.publish(body, message_id=message_id)
        except AMQPError as exc:  # DeliveryError, or the channel closed for the body's size
            if self._channel is None or self._channel.is_closed:
                self._channel = await self.connection.channel(publisher_confirms=True)
            return type(exc).__name__
        return None

    async def wait_for(
        self, task_id: str, done: Callable[[list[Seen]], bool], timeout_s: float | None = None
    ) -> list[Seen]:
        """Wait until ``done(reports of task_id)`` holds, or the timeout; return the reports."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while not done(self.reports(task_id)):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)
        return self.reports(task_id)

    async def wait_terminal(self, task_id: str, *, settle_s: float = 0.5) -> list[Seen]:
        """The reports of ``task_id`` once ``settle_s`` passed after its first terminal one.

        The quiet period shows what a worker sends after its terminal report; it counts from
        that report's arrival, so that waiting on several tasks in turn costs it about once.
        """
        reports = await self.wait_for(task_id, lambda seen: any(s.terminal for s in seen))
        last = next((seen for seen in reports if seen.terminal), None)
        if last is not None:
            left = last.at + settle_s - time.monotonic()
            if left > 0:
                await asyncio.sleep(left)
        return self.reports(task_id)

    async def _borrowing_queue(self) -> tuple[AbstractChannel, AbstractQueue]:
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=1000)
        return channel, await channel.get_queue(self.in_queue)

    async def borrow(self, body: bytes, message_id: str, times: int) -> list[int | None]:
        """Publish ``body``, and take and give it back ``times`` times before the worker sees it.

        Returns:
            The ``x-delivery-count`` header of each borrowed delivery (``None`` on the first),
            so that the caller can tell whether the broker counts give-backs at all.

        Raises:
            TimeoutError: the message did not come back to the kit within the timeout.
        """
        if times == 0:
            await self.publish(body, message_id=message_id)
            return []
        channel, queue = await self._borrowing_queue()
        counts: list[int | None] = []
        others: list[AbstractIncomingMessage] = []
        last: asyncio.Future[AbstractIncomingMessage] = asyncio.get_running_loop().create_future()

        async def on_message(message: AbstractIncomingMessage) -> None:
            if message.message_id != message_id:
                others.append(message)  # given back once this borrow ends
                return
            header = (message.headers or {}).get("x-delivery-count")
            counts.append(header if isinstance(header, int) else None)
            if len(counts) < times:
                await message.reject(requeue=True)
            elif not last.done():
                last.set_result(message)

        tag = await queue.consume(on_message, arguments={"x-priority": BORROW_PRIORITY})
        try:
            await self.publish(body, message_id=message_id)
            held = await asyncio.wait_for(last, self.timeout_s)
            # Cancelled first, so that the last give-back goes to the worker, not to the kit.
            await queue.cancel(tag)
            await held.reject(requeue=True)
            for message in others:
                await message.nack(requeue=True)
        finally:
            await channel.close()
        return counts

    async def catch_requeued(self, window_s: float) -> list[bytes]:
        """Take everything the input queue delivers within ``window_s``, and drop it.

        Call once every body published so far should be settled: whatever arrives was left in
        the queue or requeued. Taking it also ends a worker's requeue loop on it.

        Returns:
            The bodies caught.
        """
        channel, queue = await self._borrowing_queue()
        caught: list[bytes] = []

        async def on_message(message: AbstractIncomingMessage) -> None:
            caught.append(message.body)
            await message.ack()

        tag = await queue.consume(on_message, arguments={"x-priority": BORROW_PRIORITY})
        try:
            await asyncio.sleep(window_s)
            await queue.cancel(tag)
        finally:
            await channel.close()
        return caught
