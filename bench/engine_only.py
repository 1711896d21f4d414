"""The engine's own CPU per task: the real engine and metrics, on a transport that does nothing.

Run from the repository's root (no broker needed)::

    uv run python -m bench.engine_only [--tasks 20000] [--loop asyncio|uvloop]

With an older checkout's ``src`` first on ``PYTHONPATH``, the same command measures that code.

Each task is one ``Engine.handle`` call on a ready envelope of ``bench/trivial_worker.py``'s
task: decode, validate, ``started`` and ``success`` encoded and "published" (the transport
returns at once), the handler run through the inline executor, the ack, the metrics. The
figure is process CPU time per task, in milliseconds: what the worker adds to the AMQP client's
own cost.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable

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


async def _confirmed() -> None:
    """A confirm that is in already."""


class NullTransport:
    """Confirms every report and settles every delivery at once.

    It has the port of every version since the first (``publish``, then ``send``), so that an
    older checkout's engine can be measured with it.
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

    async def send(self, delivery: Delivery, report: EncodedReport) -> Awaitable[None]:
        """Drop the report; its confirm is in at once."""
        return _confirmed()

    async def ack(self, delivery: Delivery) -> None:
        """Nothing to settle."""

    async def requeue(self, delivery: Delivery, *, count_attempt: bool) -> None:
        """Nothing to settle."""

    async def reject(self, delivery: Delivery) -> None:
        """Nothing to settle."""


async def per_task_ms(tasks: int) -> float:
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
    for body in bodies:
        delivery = Delivery(body=body, headers={}, delivery_count=0, redelivered=False, handle=None)
        await engine.handle(delivery)
    return (time.process_time() - started) / tasks * 1000


def main() -> None:
    """Print the engine's CPU per task on the chosen loop."""
    parser = argparse.ArgumentParser(prog="python -m bench.engine_only", description=__doc__)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    arguments = parser.parse_args()
    # bench.loops, not runtime.loops, so that this also measures older code on PYTHONPATH.
    cost_ms = run(per_task_ms(arguments.tasks), uvloop=arguments.loop == "uvloop")
    print(f"engine alone, {arguments.loop}: {cost_ms:.3f} ms of CPU per task")


if __name__ == "__main__":
    main()
