r"""How long a client waits from ``TaskClient.cancel`` to the task's ``failure TASK_CANCELLED``.

Start a worker whose task waits to be cancelled, on a vhost of its own, then run this against
the same broker (20 tasks, one at a time: each is submitted, cancelled once its ``started`` report
arrived, which is after the worker registered it as running)::

    rabbitmqctl add_vhost m20 --default-queue-type quorum
    rabbitmqctl set_permissions -p m20 guest ".*" ".*" ".*"
    BROKER_URL=amqp://guest:guest@127.0.0.1:5672/m20 HEALTH_CHECK_PORT=0 \\
      uv run async-task-api-worker run tests.integration.cancel_workers:napping &
    uv run python -m bench.cancel_latency amqp://guest:guest@127.0.0.1:5672/m20

It prints the p50, p90 and largest time, in milliseconds, from the cancel's call to the
failure's arrival at the client (the cancel's confirm, the worker stopping the handler, the
failure's publish and confirm, its delivery to the client).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from async_task_api_worker.client import TaskClient

TASKS = 20


async def measure(url: str) -> list[float]:
    """The cancel-to-failure times of :data:`TASKS` tasks, in milliseconds, sorted."""
    times = []
    async with TaskClient(url=url, service="cancel-async") as client:
        for _ in range(TASKS):
            marker = Path(tempfile.mkdtemp()) / "nap"
            task_id = await client.submit({"marker": str(marker)})
            cancelled_at = 0.0
            async for report in client.reports(task_id):
                if report.type == "started":
                    cancelled_at = time.monotonic()
                    await client.cancel(task_id)
                elif report.type == "failure":
                    times.append((time.monotonic() - cancelled_at) * 1000)
    return sorted(times)


def main() -> None:
    """Measure and print."""
    times = asyncio.run(measure(sys.argv[1]))
    p90 = times[int(0.9 * len(times)) - 1]
    print(
        f"cancel -> failure TASK_CANCELLED at the client: p50 {statistics.median(times):.1f} ms, "
        f"p90 {p90:.1f} ms, max {times[-1]:.1f} ms over {len(times)} tasks"
    )


if __name__ == "__main__":
    main()
