"""One trace on the real broker: the client's span, the worker's, the process child's, the
reports' (their AMQP headers), checked against the messaging semantic conventions."""

from __future__ import annotations

import asyncio
import json
import os

import aio_pika
from opentelemetry.semconv._incubating.attributes import messaging_attributes as messaging
from opentelemetry.trace import SpanKind

from async_task_api_worker.client import TaskClient
from async_task_api_worker.runtime import ExitCode, Runner
from async_task_api_worker.settings import load_settings
from async_task_api_worker.transports.rabbitmq import RabbitMQTransport
from tests.integration.conftest import Queues
from tests.integration.traced_workers import traced
from tests.polling import until
from tests.traces import ids, parent_id
from tests.traces import traced as tracing_to_memory


async def reports_of_one_task(queues: Queues) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """The worker's reports of one task, up to its terminal one, read as they are."""
    connection = await aio_pika.connect(queues.url)
    try:
        channel = await connection.channel()
        queue = await channel.get_queue(queues.out_queue, ensure=False)
        received: list[aio_pika.abc.AbstractIncomingMessage] = []
        async with queue.iterator() as messages:
            async for message in messages:
                await message.ack()
                received.append(message)
                if message.type in ("success", "failure"):
                    return received
    finally:
        await connection.close()
    raise AssertionError("the output queue ended")


async def test_one_trace_from_submit_through_a_process_isolated_task_to_its_reports(
    queues: Queues,
) -> None:
    with tracing_to_memory() as spans:
        transport = RabbitMQTransport(
            urls=[queues.url], in_queue=queues.in_queue, out_queue=queues.out_queue, prefetch=1
        )
        runner = Runner(traced, load_settings({}, read_environment=False), transport)
        serving = asyncio.create_task(runner.serve())
        # Its queues are declared.
        await until(lambda: transport.consuming, 30, "the consumer to start")
        # The client reads reports from a queue of its own: the reports, headers and all, are
        # read here.
        client = TaskClient(
            url=queues.url,
            service="traced",
            in_queue=queues.in_queue,
            out_queue=f"{queues.name}_client",
        )
        async with client:
            with spans.tracer.start_as_current_span("POST /tasks") as request:
                task_id = await client.submit({})
            reports = await asyncio.wait_for(reports_of_one_task(queues), timeout=60)
        runner.request_shutdown("test")
        assert await serving is ExitCode.OK

        trace_id, request_id = ids(request)  # type: ignore[arg-type]
        submit = spans.one(f"send {queues.in_queue}")
        process = spans.one(f"process {queues.in_queue}")
        sends = spans.named(f"send {queues.out_queue}")
        settle = spans.one(f"ack {queues.in_queue}")

        # The client's PRODUCER span, a child of the request.
        assert submit.kind is SpanKind.PRODUCER
        assert parent_id(submit) == request_id
        assert dict(submit.attributes or {})[messaging.MESSAGING_MESSAGE_ID] == task_id

        # The worker's CONSUMER span continues it.
        assert process.kind is SpanKind.CONSUMER
        assert (ids(process)[0], parent_id(process)) == (trace_id, ids(submit)[1])
        attributes = dict(process.attributes or {})
        tag = attributes.pop(messaging.MESSAGING_RABBITMQ_MESSAGE_DELIVERY_TAG)
        assert isinstance(tag, int) and tag >= 1
        assert attributes == {
            messaging.MESSAGING_SYSTEM: "rabbitmq",
            messaging.MESSAGING_DESTINATION_NAME: queues.in_queue,
            messaging.MESSAGING_OPERATION_TYPE: "process",
            messaging.MESSAGING_OPERATION_NAME: "process",
            messaging.MESSAGING_MESSAGE_ID: task_id,
            "async_task_api.client_id": "cli",
            "async_task_api.outcome": "success",
        }

        # The process-isolated child ran under it.
        seen = json.loads(reports[-1].body)["response"]
        assert seen["pid"] != os.getpid()
        assert (seen["trace_id"], seen["parent_span_id"]) == (trace_id, ids(process)[1])

        # Each report carries its PRODUCER span's context; the settle is a CLIENT span.
        assert [r.type for r in reports] == ["started", "success"]
        assert len(sends) == 2
        for report, send in zip(reports, sends, strict=True):
            assert send.kind is SpanKind.PRODUCER
            assert parent_id(send) == ids(process)[1]
            assert dict(send.attributes or {})[messaging.MESSAGING_SYSTEM] == "rabbitmq"
            headers = report.headers or {}
            assert str(headers["traceparent"]).startswith(f"00-{trace_id}-{ids(send)[1]}-")
        assert settle.kind is SpanKind.CLIENT
        assert parent_id(settle) == ids(process)[1]
        assert dict(settle.attributes or {})[messaging.MESSAGING_OPERATION_TYPE] == "settle"
