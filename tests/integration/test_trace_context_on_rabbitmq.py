"""The trace context on the real broker: it leaves ``submit`` (OTEL_* variables and the SDK),
and a worker with no tracer provider passes it on to its reports."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aio_pika

from async_task_api_worker.client import build_envelope
from tests.integration.conftest import REPO, Queues, wait_for
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


async def _given_back(url: str, queue_name: str) -> aio_pika.abc.AbstractIncomingMessage:
    """The first message on ``queue_name``, read, then given back (for the next consumer)."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        queue = await channel.get_queue(queue_name, ensure=False)
        async with queue.iterator() as messages:
            async for message in messages:
                await message.nack(requeue=True)
                return message
    finally:
        await connection.close()
    raise AssertionError(f"{queue_name} ended")


def test_the_envelope_leaving_submit_carries_the_traceparent_of_its_send_span(
    queues: Queues, start_worker: Any, tmp_path: Path
) -> None:
    # The envelope is read here while submit waits, then a worker started after answers it and
    # submit ends: no window in which submit must publish (a short --timeout-s with nobody
    # serving was one, and a loaded node's quorum queue can take seconds to declare).
    out, err = tmp_path / "submit.out", tmp_path / "submit.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        submit = subprocess.Popen(
            [
                sys.executable, "-m", "async_task_api_worker", "submit", '{"text": "a b"}',
                "--service", "count-words", "--timeout-s", "60",
            ],
            cwd=REPO,
            env=queues.env(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="my-api"),
            stdout=stdout,
            stderr=stderr,
        )  # fmt: skip

    def published() -> bool:
        if "submitted task " in err.read_text():
            return True
        assert submit.poll() is None, err.read_text()  # it ended without publishing
        return False

    try:
        wait_for(published, 60, lambda: f"the envelope published:\n{err.read_text()}")
        envelope = asyncio.run(_given_back(queues.url, queues.in_queue))
        start_worker("examples.count_words:worker", queues.env())
        assert submit.wait(timeout=60) == 0, err.read_text()
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.wait()
    spans = _console_spans(err.read_text())
    (span,) = [s for s in spans if s["name"] == f"send {queues.in_queue}"]
    assert span["kind"] == "SpanKind.PRODUCER"
    assert span["resource"]["attributes"]["service.name"] == "my-api"
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
