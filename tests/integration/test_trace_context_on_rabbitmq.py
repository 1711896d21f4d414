"""The trace context on the real broker: it leaves ``submit`` (OTEL_* variables and the SDK),
and a worker with no tracer provider passes it on to its reports."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aio_pika

from async_task_api_worker.client import build_envelope
from tests.integration.conftest import Queues
from tests.integration.test_cli_on_rabbitmq import cli
from tests.integration.test_traces_on_rabbitmq import reports_of_one_task

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _console_spans(stderr: str) -> list[dict[str, Any]]:
    """The spans the console exporter wrote (indented JSON objects) among the log lines."""
    spans: list[dict[str, Any]] = []
    decoder = json.JSONDecoder()
    for match in re.finditer(r'^\{\n\s+"name"', stderr, flags=re.M):
        span, _ = decoder.raw_decode(stderr, match.start())
        spans.append(span)
    return spans


async def _first_message(url: str, queue_name: str) -> aio_pika.abc.AbstractIncomingMessage:
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        queue = await channel.get_queue(queue_name, ensure=False)
        async with queue.iterator() as messages:
            async for message in messages:
                await message.ack()
                return message
    finally:
        await connection.close()
    raise AssertionError(f"{queue_name} ended")


def test_the_envelope_leaving_submit_carries_the_traceparent_of_its_send_span(
    queues: Queues,
) -> None:
    # No worker: the envelope stays in the input queue, to be read here.
    done = cli(
        "submit", '{"text": "a b"}', "--service", "count-words", "--timeout-s", "2",
        env=queues.env(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="my-api"),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # no terminal report within 2 s: nobody serves
    (span,) = [s for s in _console_spans(done.stderr) if s["name"] == f"send {queues.in_queue}"]
    assert span["kind"] == "SpanKind.PRODUCER"
    assert span["resource"]["attributes"]["service.name"] == "my-api"
    envelope = asyncio.run(_first_message(queues.url, queues.in_queue))
    traceparent = envelope.headers["traceparent"]
    assert isinstance(traceparent, str)
    assert traceparent.split("-")[1:3] == [
        span["context"]["trace_id"].removeprefix("0x"),
        span["context"]["span_id"].removeprefix("0x"),
    ]


async def _publish_and_read_reports(queues: Queues) -> list[aio_pika.abc.AbstractIncomingMessage]:
    connection = await aio_pika.connect(queues.url)
    try:
        channel = await connection.channel()
        _, body = build_envelope({"text": "a b"}, service="count-words", client_id="c")
        await channel.default_exchange.publish(
            aio_pika.Message(body, headers={"traceparent": PARENT, "tracestate": "vendor=x"}),
            routing_key=queues.in_queue,
        )
    finally:
        await connection.close()
    return await reports_of_one_task(queues)


def test_a_worker_with_no_tracer_provider_passes_the_envelopes_trace_on_to_its_reports(
    queues: Queues, start_worker: Any
) -> None:
    start_worker("examples.count_words:worker", queues.env())
    reports = asyncio.run(_publish_and_read_reports(queues))
    assert [report.type for report in reports] == ["started", "progress", "success"]
    for report in reports:
        assert report.headers["traceparent"] == PARENT
        assert report.headers["tracestate"] == "vendor=x"


def test_cancel_exports_its_send_span_as_the_variables_say(queues: Queues) -> None:
    done = cli(
        "cancel", "t-1", "--service", "count-words",
        env=queues.env(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="my-ops"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (span,) = _console_spans(done.stderr)
    assert span["name"] == "send count-words_control"
    assert span["attributes"]["messaging.message.id"] == "t-1"
    assert span["resource"]["attributes"]["service.name"] == "my-ops"
