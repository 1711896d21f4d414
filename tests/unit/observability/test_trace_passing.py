"""Without a tracer provider, a delivery's trace context is passed on to its reports.

OpenTelemetry's API does so by itself for a library with no SDK behind it; the worker does the
same, and says a bad trace header once per kind, not once per delivery.
"""

from __future__ import annotations

import json
import logging
import textwrap

from async_task_api_worker.observability import tracing
from async_task_api_worker.transports.memory import InMemoryTransport
from tests.unit.engine.test_pushback import BODY, engine_for, worker_returning
from tests.unit.observability.test_tracing import fresh_interpreter

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


async def _reports_of(headers: dict[str, str]) -> list[dict[str, object]]:
    transport = InMemoryTransport()
    transport.put(BODY, headers)
    delivery = transport.take()
    assert delivery is not None
    settlement = await engine_for(worker_returning("ok", []), transport).handle(delivery)
    assert settlement.outcome == "success"
    return [dict(p.report.properties.headers) for p in transport.published]


async def test_a_report_without_a_tracer_provider_carries_the_envelopes_trace_id() -> None:
    assert not tracing.live()
    headers = await _reports_of({"traceparent": PARENT, "tracestate": "vendor=x"})
    assert len(headers) == 2  # started, success
    for report in headers:
        assert report["traceparent"] == PARENT  # the producer's context, passed on unchanged
        assert report["tracestate"] == "vendor=x"


async def test_a_delivery_without_a_trace_context_gets_reports_without_one() -> None:
    for report in await _reports_of({}):
        assert "traceparent" not in report


async def test_a_malformed_traceparent_is_not_passed_on() -> None:
    for report in await _reports_of({"traceparent": "00-not-a-trace-01"}):
        assert "traceparent" not in report


def test_a_passed_on_context_is_the_current_one_for_the_tasks_log_lines() -> None:
    with tracing.continued({"traceparent": PARENT}):
        assert tracing.current_ids() == (TRACE_ID, "00f067aa0ba902b7")
        assert tracing.carrier() == {"traceparent": PARENT}
    assert tracing.current_ids() is None


def test_a_bad_trace_header_is_said_once_per_kind_not_per_delivery() -> None:
    # A fresh interpreter: which kinds were said is the process's.
    script = textwrap.dedent(
        f"""
        import asyncio, logging, sys, json
        records = []
        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record)
        logging.getLogger("opentelemetry").addHandler(Keep())
        from async_task_api_worker.transports.memory import InMemoryTransport
        from tests.unit.engine.test_pushback import BODY, engine_for, worker_returning

        async def main():
            transport = InMemoryTransport()
            engine = engine_for(worker_returning("ok", []), transport)
            bad = [
                {{"traceparent": "00-" + "1" * 10_000}},  # too long: 10 KB
                {{"traceparent": "{PARENT}", "tracestate": "a=" + "b" * 10_000}},  # too long
                {{"traceparent": "{PARENT}", "tracestate": "not a member!"}},  # malformed
            ]
            for headers in bad * 5:
                transport.put(BODY, headers)
                settlement = await engine.handle(transport.take())
                assert settlement.outcome == "success", settlement

        asyncio.run(main())
        print(json.dumps([r.getMessage() for r in records]))
        """
    )
    said = json.loads(fresh_interpreter(script).stdout)
    assert len(said) == 3, said  # three kinds, fifteen deliveries
    assert all("said once" in line for line in said)
    assert any("traceparent header exceeded" in line for line in said)
    assert any("tracestate header exceeded" in line for line in said)


def test_the_filter_lets_the_first_of_each_kind_through() -> None:
    once = tracing.api.OncePerKind()
    record = logging.LogRecord(
        "opentelemetry.trace.span", logging.WARNING, "", 0, "a %s", ("x",), None
    )
    again = logging.LogRecord(
        "opentelemetry.trace.span", logging.WARNING, "", 0, "a %s", ("y",), None
    )
    other = logging.LogRecord("opentelemetry.trace.span", logging.WARNING, "", 0, "b", (), None)
    assert once.filter(record) and not once.filter(again) and once.filter(other)


def test_sending_outside_a_delivery_writes_nothing() -> None:
    with tracing.sending(InMemoryTransport(), "m") as written:
        assert dict(written) == {}
