"""An OpenTelemetry SDK set up for one test: every span kept in memory.

The global tracer provider can be set once per process, and the API has no public way to unset
it: :func:`_reset` does what OpenTelemetry's own test utilities do between tests
(``opentelemetry.test.globals_test.reset_trace_globals`` sets the same two private globals).
That package is not used for it because it pins ``opentelemetry-api`` and ``-sdk`` to the
release before the locked one. A provider set once for the whole process, instead, would trace
every other test of that process (trace ids in their log lines and messages).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


class Spans:
    """The finished spans of a test, by name."""

    def __init__(self, exporter: InMemorySpanExporter, provider: TracerProvider) -> None:
        self.exporter = exporter
        self.tracer = provider.get_tracer("tests")

    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.all() if span.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, (name, [span.name for span in self.all()])
        return found[0]


def _reset() -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@contextmanager
def traced(*processors: SpanProcessor) -> Iterator[Spans]:
    """A global SDK tracer provider for the block, exporting to memory (after ``processors``)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    for processor in processors:
        provider.add_span_processor(processor)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset()
    trace.set_tracer_provider(provider)
    try:
        yield Spans(exporter, provider)
    finally:
        provider.shutdown()
        _reset()


def ids(span: ReadableSpan) -> tuple[str, str]:
    """``(trace_id, span_id)`` of a span, in hex."""
    context = span.get_span_context()
    assert context is not None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def parent_id(span: ReadableSpan) -> str | None:
    """The hex id of the span's parent, or ``None`` for a root."""
    return None if span.parent is None else format(span.parent.span_id, "016x")
