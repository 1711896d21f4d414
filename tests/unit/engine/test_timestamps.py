"""Report timestamps never go back within a delivery, whatever the wall clock does."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pydantic import BaseModel

from async_task_api_worker import TaskContext, Worker
from async_task_api_worker.engine import Engine
from async_task_api_worker.executors import InlineExecutor
from async_task_api_worker.settings import load_settings
from async_task_api_worker.transports.memory import InMemoryTransport

# Half a second past a whole one: a step back of a second would change the AMQP timestamp.
T0 = datetime(2026, 11, 29, 22, 48, 46, 500_000, tzinfo=UTC)
HOUR, SECOND, DAY = timedelta(hours=1), timedelta(seconds=1), timedelta(days=1)


class Empty(BaseModel):
    pass


async def test_a_wall_clock_stepped_back_repeats_the_last_timestamp_of_its_delivery() -> None:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Empty, ctx: TaskContext) -> Empty:
        await ctx.progress(0.5)
        return Empty()

    # One reading per report: started, progress, success of the first delivery, then the
    # second's. The second delivery starts a day before the first: nothing holds across them.
    readings = iter(
        [T0, T0 - HOUR, T0 - SECOND, T0 - DAY, T0 - DAY - SECOND, T0 - DAY + 2 * SECOND]
    )
    transport = InMemoryTransport()
    settings = load_settings({"worker_progress_min_interval_s": 0}, read_environment=False)
    engine = Engine(
        worker, settings, transport, InlineExecutor(), wall_clock=lambda: next(readings)
    )
    for task_id in ("t-1", "t-2"):
        transport.put(
            b'{"protocol_version":1,"task_id":"%s","client_id":"c","service":"svc","input":{}}'
            % task_id.encode()
        )
        delivery = transport.take()
        assert delivery is not None
        await engine.handle(delivery)

    published = [(p.report.type, p.report.report, p.report.properties) for p in transport.published]
    assert [(kind, report.timestamp) for kind, report, _ in published] == [
        ("started", "2026-11-29T22:48:46.500000Z"),
        ("progress", "2026-11-29T22:48:46.500000Z"),  # an hour back: the last one again
        ("success", "2026-11-29T22:48:46.500000Z"),  # a second back: the last one again
        ("started", "2026-11-28T22:48:46.500000Z"),  # a new delivery: the clock as it is
        ("progress", "2026-11-28T22:48:46.500000Z"),
        ("success", "2026-11-28T22:48:48.500000Z"),  # ahead again: the clock as it is
    ]
    # The AMQP timestamp follows the report's field, in whole seconds.
    assert [properties.timestamp_s for _, _, properties in published] == [
        int(datetime.fromisoformat(report.timestamp).timestamp()) for _, report, _ in published
    ]
    assert published[1][2].timestamp_s == int(T0.timestamp())
