"""The engine's own CPU per task: the real engine and metrics, on a transport that does nothing.

Run from the repository's root (no broker needed)::

    uv run python -m bench.engine_only [--tasks 20000] [--loop asyncio|uvloop] [--traced]

With an older checkout's ``src`` first on ``PYTHONPATH``, the same command measures that code.

Each task is one ``Engine.handle`` call on a ready envelope of ``bench/trivial_worker.py``'s
task: decode, validate, ``started`` and ``success`` encoded and "published" (the transport
returns at once), the handler run through the inline executor, the ack, the metrics. The
figure is process CPU time per task, in milliseconds: what the worker adds to the AMQP client's
own cost.

``--traced`` sets up the OpenTelemetry SDK first (a batch span processor, whose exporter drops
the spans), and gives each delivery a producer's ``traceparent``: the cost of tracing, against
the same run without it (the API installed, no provider: tracing off).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from async_task_api_worker.engine.engine import Engine
from async_task_api_worker.executors import executor_for
from async_task_api_worker.observability.metrics import WorkerMetrics
from async_task_api_worker.ports import Delivery
from async_task_api_worker.protocol.envelope import Envelope, decode_envelope
from async_task_api_worker.protocol.reports import EncodedReport
from async_task_api_worker.settings import load_settings
from bench.contenders import our_envelope
from bench.loops import run
from bench.trivial_worker import worker


class NullDelivery(Delivery):
    """A delivery (the message-shaped port) whose reports and settles return at once."""

    __slots__ = ()

    async def report(
        self, report: EncodedReport, *, placed: Callable[[], None] | None = None
    ) -> None:
        """Drop the report: placed, and its confirm in, at once."""
        if placed is not None:
            placed()

    async def ack(self) -> None:
        """Nothing to settle."""

    async def retry(self) -> None:
        """Nothing to settle."""

    async def give_back(self) -> None:
        """Nothing to settle."""

    async def reject(self) -> None:
        """Nothing to settle."""


def delivery_of(body: bytes, headers: dict[str, str]) -> Delivery:
    """A delivery of ``body`` in the shape of the port on ``PYTHONPATH``.

    The message-shaped port's carries its envelope and settles itself; before it, a delivery
    was the body, and the transport read and settled it.
    """
    if hasattr(Delivery, "give_back"):
        return NullDelivery(decode_envelope(body), headers=headers)
    return Delivery(body=body, headers=headers, delivery_count=0, redelivered=False, handle=None)  # type: ignore[call-arg]


class NullTransport:
    """Confirms every report and settles every delivery at once.

    It has the port of every version since the first (``publish``, then ``send``; then the
    message-shaped port, where it only names its queue), so that an older checkout's engine
    can be measured with it.
    """

    delivery_count_known = True
    deletes_on_pickup = False

    def envelope(self, delivery: Delivery, *, max_body_bytes: int) -> Envelope:
        """The body, decoded as the envelope."""
        return decode_envelope(delivery.body, max_body_bytes=max_body_bytes)

    async def release(self, delivery: Delivery) -> None:
        """Nothing is held."""

    async def publish(self, delivery: Delivery, report: EncodedReport) -> None:
        """Drop the report."""

    async def send(
        self,
        delivery: Delivery,
        report: EncodedReport,
        *,
        placed: Callable[[], None] | None = None,
    ) -> None:
        """Drop the report: placed, and its confirm in, at once."""
        if placed is not None:
            placed()

    async def ack(self, delivery: Delivery) -> None:
        """Nothing to settle."""

    async def requeue(self, delivery: Delivery, *, count_attempt: bool) -> None:
        """Nothing to settle."""

    async def reject(self, delivery: Delivery) -> None:
        """Nothing to settle."""

    def span_attributes(self, delivery: Delivery | None) -> dict[str, str]:
        """A queue's name, for the spans of ``--traced``."""
        return {"messaging.system": "rabbitmq", "messaging.destination.name": "bench"}


#: A producer's context, as a traced API would send it.
TRACEPARENT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def trace_to_nowhere() -> None:
    """The OpenTelemetry SDK as an application sets it up, exporting to nowhere."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Nowhere(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Nowhere()))
    trace.set_tracer_provider(provider)


async def per_task_ms(tasks: int, *, traced: bool = False) -> float:
    """Handle ``tasks`` deliveries one by one; the process CPU per task, in ms."""
    settings = load_settings({}, read_environment=False)
    engine = Engine(
        worker,
        settings,
        NullTransport(),  # type: ignore[arg-type]
        executor_for(worker.task_definition, settings),
        observers=[WorkerMetrics()],
    )
    bodies = [our_envelope(f"t-{number}") for number in range(tasks)]
    started = time.process_time()
    headers = TRACEPARENT if traced else {}
    for body in bodies:
        await engine.handle(delivery_of(body, headers))
    return (time.process_time() - started) / tasks * 1000


def main() -> None:
    """Print the engine's CPU per task on the chosen loop."""
    parser = argparse.ArgumentParser(prog="python -m bench.engine_only", description=__doc__)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--traced", action="store_true", help="with OpenTelemetry's SDK")
    arguments = parser.parse_args()
    if arguments.traced:
        trace_to_nowhere()
    # bench.loops, not runtime.loops, so that this also measures older code on PYTHONPATH.
    cost_ms = run(
        per_task_ms(arguments.tasks, traced=arguments.traced), uvloop=arguments.loop == "uvloop"
    )
    traced = ", traced" if arguments.traced else ""
    print(f"engine alone, {arguments.loop}{traced}: {cost_ms:.3f} ms of CPU per task")


if __name__ == "__main__":
    main()
