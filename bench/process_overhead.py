"""Per-task cost of process isolation: the fork server against a fresh interpreter per task.

Run from the repository's root::

    uv run python -m bench.process_overhead [--tasks 500]

Each task runs the no-op handler of ``bench/noop_worker.py`` through the real
``ProcessExecutor`` (spawn or fork, request over the channel, answer, kill of the group, reap),
one at a time, in one process, every way in the same run: the fork server without and with
the lease ``run`` gives each task's group (its watchdog process, ``docs/isolation.md``), and a
fresh interpreter. The figures are the wall time of one
``execute`` call; the ratio is the one to quote.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import time

from async_task_api_worker._version import __version__
from async_task_api_worker.executors.process import ProcessExecutor
from async_task_api_worker.ports import ExecutionRequest, Lease
from async_task_api_worker.testing import make_task_context
from bench.noop_worker import Nothing, noop


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def _measure(executor: ProcessExecutor, tasks: int) -> list[float]:
    await executor.start()
    durations = []
    for number in range(tasks):
        request = ExecutionRequest(
            handler=noop.task_definition.handler,
            task_input=Nothing(),
            raw_input={},
            context=make_task_context(task_id=f"bench-{number}"),
            timeout_s=60.0,
            task_id=f"bench-{number}",
            output_model=noop.task_definition.output_model,
        )
        started = time.perf_counter()
        await executor.execute(request)
        durations.append(time.perf_counter() - started)
    await executor.aclose()
    return durations


async def main(tasks: int) -> None:
    """Measure both ways, ``tasks`` each, and print the table and the ratio."""
    task = noop.task_definition
    fork = await _measure(ProcessExecutor(task), tasks)
    # As ``run`` starts it: each task's group holds a lease (its watchdog process, the renewals).
    leased = await _measure(ProcessExecutor(task, lease=Lease(30.0, lambda: True)), tasks)
    spawn = await _measure(ProcessExecutor(task, use_fork_server=False), tasks)
    rows = [("fork server", fork), ("fork server, lease", leased), ("fresh interpreter", spawn)]
    print(f"# process isolation, per-task cost of a no-op handler ({tasks} tasks each)")
    print(
        f"# {platform.node()}, {platform.machine()}, Python {platform.python_version()}, "
        f"async-task-api-worker {__version__}, {time.strftime('%Y-%m-%d')}"
    )
    print(f"{'way':<20}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for name, values in rows:
        print(
            f"{name:<20}{_percentile(values, 0.5) * 1000:>10.2f}"
            f"{_percentile(values, 0.99) * 1000:>10.2f}{statistics.fmean(values) * 1000:>10.2f}"
        )
    p50 = _percentile(spawn, 0.5) / _percentile(fork, 0.5)
    p99 = _percentile(spawn, 0.99) / _percentile(fork, 0.99)
    print(f"fork server is {p50:.1f}x cheaper at p50, {p99:.1f}x at p99")
    lease_ms = (_percentile(leased, 0.5) - _percentile(fork, 0.5)) * 1000
    print(f"the lease adds {lease_ms:.2f} ms per task at p50")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=500)
    asyncio.run(main(parser.parse_args().tasks))
    sys.exit(0)
