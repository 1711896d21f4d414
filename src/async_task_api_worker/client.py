"""Submit tasks to a worker, cancel them, follow their reports: the producer's side.

Example::

    async with TaskClient.from_settings(service="count-words") as client:
        task_id = await client.submit({"text": "hello big world"})
        async for report in client.reports(task_id):
            print(report.type)

It publishes the envelope the AsyncTaskAPI would publish (docs/protocol.md, "The envelope") to
the worker's input queue, cancel requests to its control exchange ("Cancelling a task"), and
reads the reports of its tasks from the output queue. Reports of tasks
it did not submit are given back for their owners: point it at an output queue nobody else
consumes (a development or staging set-up), since RabbitMQ before 4.3 counts each give-back as
a delivery of that report.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from async_task_api_worker.errors import ProtocolError
from async_task_api_worker.observability import tracing
from async_task_api_worker.protocol.cancel import encode_cancel
from async_task_api_worker.protocol.encoding import canonical_dumps
from async_task_api_worker.protocol.envelope import PROTOCOL_VERSION, InputRef
from async_task_api_worker.protocol.reports import (
    FailureReport,
    ProgressReport,
    StartedReport,
    SuccessReport,
    decode_report,
)
from async_task_api_worker.settings import WorkerSettings, load_settings
from async_task_api_worker.transports.rabbitmq.client import RabbitMQProducer, ReportMessage

__all__ = ["AnyReport", "TaskClient", "build_envelope"]

AnyReport = StartedReport | ProgressReport | SuccessReport | FailureReport


def build_envelope(
    task_input: Mapping[str, Any],
    *,
    service: str,
    task_id: str | None = None,
    client_id: str = "cli",
    input_refs: Sequence[InputRef | Mapping[str, Any]] = (),
) -> tuple[str, bytes]:
    """Build the envelope bytes the API publishes for one task.

    Returns:
        ``(task_id, body)``; the task id is a new UUID unless given.
    """
    task_id = str(uuid.uuid4()) if task_id is None else task_id
    envelope = {
        "protocol_version": PROTOCOL_VERSION,
        "task_id": task_id,
        "client_id": client_id,
        "service": service,
        "input": dict(task_input),
        "input_refs": [
            ref.model_dump(exclude_none=True) if isinstance(ref, InputRef) else dict(ref)
            for ref in input_refs
        ],
    }
    return task_id, canonical_dumps(envelope)


class TaskClient:
    """Submits tasks to one worker service, cancels them, and yields each task's reports.

    Args:
        url: the AMQP URL (``BROKER_URL``).
        service: the worker's service name (the envelope's ``service``).
        in_queue: the worker's input queue (default ``<service>_queue_in``).
        out_queue: the worker's output queue (default ``<service>_queue_out``).
        control_exchange: the worker's control exchange, where :meth:`cancel` publishes
            (default ``<service>_control``, the rule of ``CONTROL_EXCHANGE_NAME``).
        client_id: this client's id (the id pattern): the ``client_id`` of its envelopes unless
            :meth:`submit` is given another, and of its cancel requests.
    """

    def __init__(
        self,
        *,
        url: str,
        service: str,
        in_queue: str | None = None,
        out_queue: str | None = None,
        control_exchange: str | None = None,
        client_id: str = "cli",
    ) -> None:
        self.service = service
        self.client_id = client_id
        # The exchange's name rule lives in settings alone; model_construct gives the defaults
        # without reading the environment (an explicit client ignores CONTROL_EXCHANGE_NAME,
        # as it ignores IN_QUEUE_NAME: from_settings reads them).
        self.control_exchange = (
            control_exchange or WorkerSettings.model_construct().control_exchange(service)
        )
        self._producer = RabbitMQProducer(
            url=url,
            in_queue=in_queue or f"{service}_queue_in",
            out_queue=out_queue or f"{service}_queue_out",
            control_exchange=self.control_exchange,
        )
        self._inboxes: dict[str, asyncio.Queue[AnyReport]] = {}
        self._started = False

    @classmethod
    def from_settings(
        cls, *, service: str, settings: WorkerSettings | None = None, client_id: str = "cli"
    ) -> TaskClient:
        """A client reading ``BROKER_URL`` and the queue and exchange names as a worker does.

        The names: ``IN_QUEUE_NAME``, ``OUT_QUEUE_NAME``, ``CONTROL_EXCHANGE_NAME``.

        Raises:
            SettingsError: a setting is invalid.
        """
        settings = settings or load_settings()
        return cls(
            url=settings.broker_url.get_secret_value(),
            service=service,
            in_queue=settings.in_queue(service),
            out_queue=settings.out_queue(service),
            control_exchange=settings.control_exchange(service),
            client_id=client_id,
        )

    async def __aenter__(self) -> TaskClient:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def connect(self, *, reports: bool = True) -> None:
        """Connect, declare the queues and start reading the output queue.

        Args:
            reports: read the output queue. A client that only cancels passes ``False``: it
                then declares no queue and consumes nothing, so that it never holds (and gives
                back) reports of other tasks; :meth:`reports` then yields nothing.

        Raises:
            BrokerRefusedError: the broker refused the credentials, the vhost or a queue.
            BrokerUnavailableError: the broker was not reached in time.
            TransportError: the queues could not be declared.
        """
        await self._producer.connect(queues=reports)
        if reports:
            await self._producer.consume_reports(self._on_report)
        self._started = True

    async def close(self) -> None:
        """Close the connection; reports not yet acked go back to the output queue."""
        await self._producer.close()

    async def submit(
        self,
        task_input: Mapping[str, Any],
        *,
        task_id: str | None = None,
        client_id: str | None = None,
        input_refs: Sequence[InputRef | Mapping[str, Any]] = (),
    ) -> str:
        """Publish one task and start collecting its reports.

        Args:
            task_input: the task input, a JSON object.
            task_id: the task id (default: a new UUID).
            client_id: the envelope's client id (default: this client's).
            input_refs: input references (docs/protocol.md, "The envelope").

        Returns:
            The task id.

        Raises:
            PublishError: the broker did not confirm the envelope.
            ReportEncodeError: the input is not canonical JSON.
        """
        task_id, body = build_envelope(
            task_input,
            service=self.service,
            task_id=task_id,
            client_id=self.client_id if client_id is None else client_id,
            input_refs=input_refs,
        )
        self._inboxes.setdefault(task_id, asyncio.Queue())
        # A ``send`` span: the worker's spans of the task are its children.
        with tracing.sending(self, task_id) as headers:
            await self._producer.publish(body, message_id=task_id, headers=headers)
        return task_id

    async def cancel(self, task_id: str) -> bool:
        """Ask the service's workers to cancel ``task_id``, and wait for the broker's confirm.

        Publishes one cancel request (docs/protocol.md, "Cancelling a task"), from this
        client's :attr:`client_id`, to the fanout :attr:`control_exchange`, declared durable
        first so that a cancel may precede any worker. Only the workers bound to the exchange
        at that moment receive it; the task, if it has not concluded, then concludes with
        ``failure`` ``TASK_CANCELLED``. Nothing here waits for that: a worker that does not
        implement cancels, or a task that concluded first, still ends as it would have, so
        keep reading the task's reports for its outcome.

        Returns:
            Whether any worker was bound to the exchange to receive it (``False``: a wrong
            service name, or no worker running or connected at that moment).

        Raises:
            ValueError: ``task_id`` (or this client's id) breaks the id pattern.
            BrokerRefusedError: the broker refused the exchange (permissions, or it exists
                with another type or other flags).
            PublishError: the broker did not confirm the request, or the client is not
                connected.
        """
        body, properties = encode_cancel(task_id, self.client_id, datetime.now(UTC))
        # A ``send`` span of its own; no context leaves with it (a cancel carries no headers).
        with tracing.sending(_ControlExchange(self.control_exchange), task_id):
            return await self._producer.publish_cancel(body, properties)

    def span_attributes(self, delivery: None) -> Mapping[str, str]:
        """The input queue, for the ``send`` span of :meth:`submit` (``observability.tracing``)."""
        return {
            "messaging.system": "rabbitmq",
            "messaging.destination.name": self._producer.in_queue,
            "messaging.rabbitmq.destination.routing_key": self._producer.in_queue,
        }

    async def publish_raw(self, body: bytes) -> None:
        """Publish ``body`` to the input queue as it is (a hand-made or poison message).

        Raises:
            PublishError: the broker did not confirm it.
        """
        await self._producer.publish(body)

    def watch(self, task_id: str) -> None:
        """Collect the reports of ``task_id`` even though this client did not submit it."""
        self._inboxes.setdefault(task_id, asyncio.Queue())

    async def reports(self, task_id: str) -> AsyncIterator[AnyReport]:
        """Yield the reports of ``task_id`` in order, ending after its terminal report.

        Raises:
            KeyError: this client neither submitted nor watches ``task_id``.
        """
        inbox = self._inboxes[task_id]
        while True:
            report = await inbox.get()
            yield report
            if isinstance(report, SuccessReport | FailureReport):
                return

    async def _on_report(self, message: ReportMessage) -> None:
        inbox = self._inboxes.get(message.correlation_id or "")
        if inbox is None:
            message.give_back()
            return
        try:
            report = decode_report(message.body)
        except ProtocolError:
            message.give_back()
            return
        inbox.put_nowait(report)
        await message.ack()


@dataclass(frozen=True)
class _ControlExchange:
    """Where :meth:`TaskClient.cancel` publishes, for its ``send`` span's attributes."""

    name: str

    def span_attributes(self, delivery: None) -> Mapping[str, str]:
        return {"messaging.system": "rabbitmq", "messaging.destination.name": self.name}
