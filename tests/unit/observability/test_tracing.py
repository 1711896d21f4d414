"""Traces: one delivery is one trace from its producer to its reports and settle.

Span names, kinds and attributes are checked against OpenTelemetry's messaging semantic
conventions, by the names the ``opentelemetry-semantic-conventions`` package gives them.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.semconv._incubating.attributes import messaging_attributes as messaging
from opentelemetry.semconv.attributes import error_attributes
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel

from async_task_api_worker import FatalError, SyncTaskContext, TaskContext, Worker
from async_task_api_worker.observability import tracing
from async_task_api_worker.observability.logging import JsonFormatter, TaskContextFilter
from async_task_api_worker.ports import Action, Outcome
from async_task_api_worker.task_call import DISCARD_PROGRESS, TaskFields, call_here
from async_task_api_worker.transports.memory import InMemoryTransport
from tests.traces import Spans, ids, parent_id, traced
from tests.unit.engine.test_pushback import BODY, engine_for, worker_returning


class Input(BaseModel):
    fail: bool = False


class Output(BaseModel):
    seen_trace_id: str
    seen_parent_id: str


def traced_worker() -> Worker:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        with trace.get_tracer("handler").start_as_current_span("handler work"):
            logging.getLogger("async_task_api_worker.task").warning("inside the handler")
        if task_input.fail:
            raise FatalError("NO_GOOD", "refused")
        trace_id, span_id = tracing.current_ids() or ("", "")
        return Output(seen_trace_id=trace_id, seen_parent_id=span_id)

    return worker


def child_worker() -> Worker:
    """A ``def`` task, as a child runs it: it answers with the span it runs under."""
    worker = Worker("svc")

    @worker.task(timeout=5)
    def handle(task_input: Input, ctx: SyncTaskContext) -> Output:
        trace_id, span_id = tracing.current_ids() or ("", "")
        return Output(seen_trace_id=trace_id, seen_parent_id=span_id)

    return worker


def fresh_interpreter(script: str, **environment: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a new interpreter (tracing's module state is per process); it ran."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=os.getcwd(),
        env={**os.environ, **environment},
    )
    assert done.returncode == 0, done.stderr
    return done


class _Lines(logging.Handler):
    """The SDK's JSON lines, as the SDK's own handler writes them (with its filter)."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(TaskContextFilter())
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


async def _run(spans: Spans, body: bytes) -> tuple[InMemoryTransport, ReadableSpan, list[dict]]:
    transport = InMemoryTransport()
    lines = _Lines()
    sdk_logger = logging.getLogger("async_task_api_worker")
    level = sdk_logger.level
    sdk_logger.setLevel(logging.INFO)  # the decision line is said at INFO
    sdk_logger.addHandler(lines)
    try:
        with spans.tracer.start_as_current_span("send in", kind=SpanKind.PRODUCER) as producer:
            transport.put(body, tracing.carrier())
        delivery = transport.take()
        assert delivery is not None
        await engine_for(traced_worker(), transport).handle(delivery)
    finally:
        sdk_logger.removeHandler(lines)
        sdk_logger.setLevel(level)
    assert isinstance(producer, ReadableSpan)
    return transport, producer, lines.lines


def _attributes(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


async def test_a_delivery_is_one_trace_from_its_producer_to_its_reports_and_settle() -> None:
    with traced() as spans:
        transport, producer, lines = await _run(spans, BODY)
        process = spans.one("process in")
        trace_id, process_id = ids(process)

        # The CONSUMER span continues the producer's trace, with the conventions' attributes.
        assert process.kind is SpanKind.CONSUMER
        assert ids(producer)[0] == trace_id
        assert parent_id(process) == ids(producer)[1]
        assert _attributes(process) == {
            messaging.MESSAGING_SYSTEM: "memory",
            messaging.MESSAGING_DESTINATION_NAME: "in",
            messaging.MESSAGING_OPERATION_TYPE: "process",
            messaging.MESSAGING_OPERATION_NAME: "process",
            messaging.MESSAGING_MESSAGE_ID: "t-1",
            "async_task_api.client_id": "c",
            "async_task_api.outcome": "success",
        }

        # The handler's own span is its child, and so is what the handler saw as current.
        assert parent_id(spans.one("handler work")) == process_id
        published = [p.report for p in transport.published]
        response = json.loads(published[-1].body)["response"]
        assert response == {"seen_trace_id": trace_id, "seen_parent_id": process_id}

        # One PRODUCER span per report, whose context the report carries in its headers.
        sends = spans.named("send out")
        assert [s.kind for s in sends] == [SpanKind.PRODUCER, SpanKind.PRODUCER]
        for report, send in zip(published, sends, strict=True):
            assert parent_id(send) == process_id
            assert _attributes(send)[messaging.MESSAGING_OPERATION_TYPE] == "send"
            assert _attributes(send)[messaging.MESSAGING_MESSAGE_ID] == (
                report.properties.message_id
            )
            send_trace, send_id = ids(send)
            traceparent = report.properties.headers["traceparent"]
            assert traceparent.startswith(f"00-{send_trace}-{send_id}-")

        # The settle is a CLIENT span of the delivery.
        settle = spans.one("ack in")
        assert settle.kind is SpanKind.CLIENT
        assert parent_id(settle) == process_id
        assert _attributes(settle)[messaging.MESSAGING_OPERATION_TYPE] == "settle"
        assert _attributes(settle)[messaging.MESSAGING_OPERATION_NAME] == "ack"

        # Every line of the task carries the span it was written in; the decision line too.
        handler_line = next(line for line in lines if line["msg"] == "inside the handler")
        assert handler_line["trace_id"] == trace_id
        assert handler_line["span_id"] == ids(spans.one("handler work"))[1]
        decision = next(line for line in lines if str(line["msg"]).startswith("Delivery settled"))
        assert (decision["trace_id"], decision["span_id"]) == (trace_id, process_id)


async def test_a_failed_task_sets_its_code_as_the_error_type() -> None:
    body = BODY.replace(b'"input":{}', b'"input":{"fail":true}')
    with traced() as spans:
        transport, _, _ = await _run(spans, body)
        process = spans.one("process in")
        assert _attributes(process)[error_attributes.ERROR_TYPE] == "NO_GOOD"
        assert process.status.status_code is StatusCode.ERROR
        assert spans.one("ack in").kind is SpanKind.CLIENT  # a concluded failure is acked
        assert transport.acked


async def test_a_requeue_is_a_nack_span() -> None:
    with traced() as spans:
        transport = InMemoryTransport()
        transport.put(b"not json at all")
        delivery = transport.take()
        assert delivery is not None
        settlement = await engine_for(traced_worker(), transport).handle(delivery)
        assert (settlement.outcome, settlement.action) == (Outcome.POISON, Action.REJECT)
        reject = spans.one("reject in")
        assert _attributes(reject)[messaging.MESSAGING_OPERATION_NAME] == "reject"
        assert _attributes(spans.one("process in"))[error_attributes.ERROR_TYPE] == "poison"


def test_a_child_process_continues_the_trace_it_is_handed() -> None:
    worker = child_worker()
    with traced() as spans, spans.tracer.start_as_current_span("process in") as process:
        fields = TaskFields("t", "c", "svc", 1, 5, trace=tracing.carrier())
    # Through the JSON a child reads its fields from, and out of the parent's context.
    fields = TaskFields.from_json(json.loads(json.dumps(fields.to_json())))
    conclusion = call_here(worker.task_definition, {}, fields, DISCARD_PROGRESS)
    assert isinstance(process, ReadableSpan)
    trace_id, span_id = ids(process)
    assert conclusion.value == {"seen_trace_id": trace_id, "seen_parent_id": span_id}  # type: ignore[union-attr]


def test_the_environment_carries_a_trace_to_a_subprocess() -> None:
    with traced() as spans, spans.tracer.start_as_current_span("process in") as process:
        environment = tracing.carrier_to_env()
    assert isinstance(process, ReadableSpan)
    trace_id, span_id = ids(process)
    assert list(environment) == ["TRACEPARENT"]
    assert environment["TRACEPARENT"].startswith(f"00-{trace_id}-{span_id}-")
    assert tracing.carrier_from_env(environment) == {"traceparent": environment["TRACEPARENT"]}
    with tracing.continued(tracing.carrier_from_env(environment)):
        assert tracing.current_ids() == (trace_id, span_id)


def test_without_a_tracer_provider_nothing_is_traced_or_written() -> None:
    assert not tracing.live()
    assert tracing.carrier() == {}
    with tracing.sending(InMemoryTransport(), "m") as headers:
        assert dict(headers) == {}


def test_without_the_extra_the_worker_runs_untraced() -> None:
    # A fresh interpreter in which `import opentelemetry` fails, as without the `otel` extra.
    script = textwrap.dedent(
        """
        import asyncio, sys
        sys.modules["opentelemetry"] = None
        from async_task_api_worker.observability import tracing
        from async_task_api_worker.transports.memory import InMemoryTransport
        from tests.unit.engine.test_pushback import BODY, engine_for, worker_returning
        assert not tracing.ENABLED and not tracing.live()
        assert tracing.carrier() == {} and tracing.current_ids() is None

        async def main():
            transport = InMemoryTransport()
            transport.put(BODY, {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
            settlement = await engine_for(worker_returning("ok", []), transport).handle(
                transport.take()
            )
            assert settlement.outcome == "success", settlement
            assert all(not p.report.properties.headers for p in transport.published)

        asyncio.run(main())
        print("untraced")
        """
    )
    done = fresh_interpreter(script)
    assert done.stdout.strip() == "untraced"


def test_a_step_functions_child_continues_the_trace_of_its_environment() -> None:
    with traced() as spans, spans.tracer.start_as_current_span("process q") as process:
        environment = tracing.carrier_to_env()  # as sfn.subprocesses sets them
    assert isinstance(process, ReadableSpan)
    done = fresh_interpreter(
        "from async_task_api_worker.sfn.task_child import run_task\n"
        "from tests.unit.observability.test_tracing import child_worker\n"
        "run_task(child_worker())\n",
        WORKER_REQUEST=json.dumps({"task_token": "t", "input": {}}),
        **environment,
    )
    trace_id, span_id = ids(process)
    assert json.loads(done.stdout) == {"seen_trace_id": trace_id, "seen_parent_id": span_id}


class Failing(SpanProcessor):
    """A span processor that raises where ``where`` says: the SDK lets it through."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: object, parent_context: object = None) -> None:
        if self.where == "start":
            raise RuntimeError("a span processor failed on start")

    def on_end(self, span: object) -> None:
        if self.where == "end":
            raise RuntimeError("a span processor failed on end")


@pytest.mark.parametrize("where", ["start", "end"])
async def test_a_failing_span_processor_changes_nothing_of_a_delivery(
    where: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="async_task_api_worker.tracing")
    with traced(Failing(where)):
        transport = InMemoryTransport()
        for _ in range(2):
            transport.put(BODY)
        engine = engine_for(worker_returning("ok", []), transport)  # no span of its own
        for _ in range(2):
            delivery = transport.take()
            assert delivery is not None
            settlement = await engine.handle(delivery)
            assert (settlement.outcome, settlement.action) == (Outcome.SUCCESS, Action.ACK)
    assert [p.report.type for p in transport.published] == ["started", "success"] * 2
    assert len(transport.acked) == 2
    said = [r.getMessage() for r in caplog.records if r.name == "async_task_api_worker.tracing"]
    assert said and all(f"a span processor failed on {where}" in line for line in said)
    assert len(said) == len(set(said))  # each failure said once, not once a span


async def test_an_unsampled_producer_gets_reports_that_say_so() -> None:
    unsampled = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-00"}
    with traced() as spans:
        transport = InMemoryTransport()
        transport.put(BODY, unsampled)
        delivery = transport.take()
        assert delivery is not None
        await engine_for(traced_worker(), transport).handle(delivery)
        assert spans.all() == []  # the producer's decision is followed: nothing recorded
    for published in transport.published:
        traceparent = published.report.properties.headers["traceparent"]
        assert traceparent.startswith("00-" + "a" * 32 + "-") and traceparent.endswith("-00")


@pytest.mark.parametrize(
    "variable",
    [{"OTEL_PROPAGATORS": "b3"}, {"OTEL_PYTHON_TRACER_PROVIDER": "no_such_provider"}],
)
def test_a_tracing_environment_that_cannot_load_leaves_the_worker_working(
    variable: dict[str, str],
) -> None:
    script = textwrap.dedent(
        """
        import asyncio, logging
        logging.basicConfig(level=logging.WARNING)
        from async_task_api_worker.observability import tracing
        from async_task_api_worker.transports.memory import InMemoryTransport
        from tests.unit.engine.test_pushback import BODY, engine_for, worker_returning

        async def main():
            transport = InMemoryTransport()
            transport.put(BODY)
            settlement = await engine_for(worker_returning("ok", []), transport).handle(
                transport.take()
            )
            assert settlement.outcome == "success", settlement

        asyncio.run(main())
        print("worked")
        """
    )
    done = fresh_interpreter(script, **variable)
    assert done.stdout.strip() == "worked"
    assert done.stderr.count("Tracing failed to") == 1, done.stderr


async def test_a_producers_baggage_is_not_read(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="opentelemetry")
    headers = {
        "traceparent": "00-" + "c" * 32 + "-" + "d" * 16 + "-01",
        "baggage": "x" * 70_000,  # over the W3C limit: its propagator would say so
    }
    with traced() as spans:
        transport = InMemoryTransport()
        transport.put(BODY, headers)
        delivery = transport.take()
        assert delivery is not None
        await engine_for(worker_returning("ok", []), transport).handle(delivery)
        assert ids(spans.one("process in"))[0] == "c" * 32
    assert [r for r in caplog.records if r.name.startswith("opentelemetry")] == []
