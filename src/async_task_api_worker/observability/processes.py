"""Several worker processes observed as one worker (``run --processes N``, ``runtime.processes``).

The supervisor serves one pod's probes and metrics for all its worker processes:
:func:`fetch_readiness` reads a worker process's own ``/ready`` (the rule stays the runner's,
``observability.probes``), and :class:`ProcessesMetrics` adds up the multiprocess files they
write (the families stay ``observability.metrics.WorkerMetrics``'s).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, Info
from prometheus_client.metrics_core import Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from async_task_api_worker._version import __version__
from async_task_api_worker.observability.metrics import WorkerMetrics, exposition_of
from async_task_api_worker.observability.probes import MAX_REQUEST_BYTES

__all__ = ["ProcessesMetrics", "fetch_readiness"]

#: Bytes of a worker process's ``/ready`` answer :func:`fetch_readiness` reads at most.
MAX_ANSWER_BYTES: Final = 1024 * 1024


async def fetch_readiness(host: str, port: int, *, timeout_s: float) -> dict[str, str]:
    """Ask another probes server's ``/ready``, as a readiness probe would.

    Args:
        host: its address (a worker process's loopback address).
        port: its port.
        timeout_s: seconds for the whole exchange, connecting included.

    Returns:
        Its failing components and why, as its ``503`` names them; empty when it answered
        ``200``.

    Raises:
        OSError: it could not be reached (``ConnectionRefusedError``: nothing listens yet).
        TimeoutError: it did not answer within ``timeout_s``.
        ValueError: its answer is not one a probes server gives.
    """

    async def exchange() -> bytes:
        reader, writer = await asyncio.open_connection(host, port, limit=MAX_REQUEST_BYTES)
        try:
            writer.write(b"GET /ready HTTP/1.1\r\nHost: probes\r\nConnection: close\r\n\r\n")
            await writer.drain()
            # A probes server closes after its answer; a 503 names a few components, so an
            # answer past the bound is not one.
            answer = b""
            while chunk := await reader.read(65536):
                answer += chunk
                if len(answer) > MAX_ANSWER_BYTES:
                    raise ValueError("an answer too large for a probes server's")
            return answer
        finally:
            writer.close()

    answer = await asyncio.wait_for(exchange(), timeout=timeout_s)
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ")
    if len(parts) < 2 or parts[1] not in ("200", "503"):
        raise ValueError(f"unexpected answer {status_line[:40]!r}")
    if parts[1] == "200":
        return {}
    try:
        components = json.loads(body)["components"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("a 503 without its components") from None
    if not isinstance(components, dict):
        raise ValueError("a 503 without its components")
    return {str(name): str(why) for name, why in components.items()}


class ProcessesMetrics:
    """The metrics of a supervisor's worker processes, served as one worker's.

    Args:
        directory: the ``PROMETHEUS_MULTIPROC_DIR`` the worker processes write to (set before
            they import prometheus-client).
        pids: returns the process ids of the worker processes alive now.

    How each family adds up: the counters and the histogram are summed over every process that
    ran, a dead one's counts included (a restart does not make them go back);
    ``worker_tasks_in_flight`` is summed over the live processes and ``event_loop_lag_seconds``
    is the largest of theirs; ``worker_sdk_info`` and ``python_info`` are the supervisor's (the
    same interpreter and package); ``process_*`` are summed over the supervisor and the live
    processes (``process_start_time_seconds`` and ``process_max_fds``: the lowest). The
    ``python_gc_*`` series are left out: one interpreter's collections do not add up with
    another's. Only the families :class:`WorkerMetrics` defines are served, as one process
    serves only its own registry.
    """

    def __init__(self, directory: str, pids: Callable[[], Iterable[int]]) -> None:
        # Late: a single worker process never needs the multiprocess reader.
        from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

        self._directory = directory
        self._mark_dead = mark_process_dead
        names = {family.name for family in WorkerMetrics(CollectorRegistry()).registry.collect()}
        self.registry = CollectorRegistry()
        files = MultiProcessCollector(None, path=directory)  # type: ignore[no-untyped-call]
        self.registry.register(_Only(files, names))
        Info("worker_sdk", "The async-task-api-worker SDK.", registry=self.registry).info(
            {"version": __version__}
        )
        PlatformCollector(registry=self.registry)
        self.registry.register(_SummedProcesses(pids))

    def process_dead(self, pid: int) -> None:
        """Forget the live gauges of the worker process ``pid``, which has exited."""
        self._mark_dead(pid, self._directory)  # type: ignore[no-untyped-call]

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The metrics in the format ``accept`` asks for; see :func:`exposition_of`."""
        return exposition_of(self.registry, accept)


class _Collecting(Protocol):
    def collect(self) -> Iterable[Metric]: ...


class _Only:
    """A collector's families whose names are in ``names``."""

    def __init__(self, collector: _Collecting, names: set[str]) -> None:
        self._collector = collector
        self._names = names

    def collect(self) -> Iterator[Metric]:
        return (family for family in self._collector.collect() if family.name in self._names)


#: Process families whose sum means nothing: the lowest is kept (the oldest start, the
#: tightest limit).
_LOWEST_OF_PROCESSES: Final = frozenset({"process_start_time_seconds", "process_max_fds"})


class _SummedProcesses:
    """prometheus-client's process collector over the supervisor and the live processes."""

    def __init__(self, pids: Callable[[], Iterable[int]]) -> None:
        self._pids = pids

    def collect(self) -> list[Metric]:
        families: dict[str, Metric] = {}
        pids: list[int | str] = ["self", *self._pids()]
        for pid in pids:
            # One process that ended since the list was made reads as no family at all.
            collector = ProcessCollector(pid=functools.partial(str, pid), registry=None)
            for family in collector.collect():
                known = families.setdefault(family.name, family)
                if known is family:
                    continue
                first, value = known.samples[0], family.samples[0].value
                if family.name in _LOWEST_OF_PROCESSES:
                    known.samples[0] = first._replace(value=min(first.value, value))
                else:
                    known.samples[0] = first._replace(value=first.value + value)
        return list(families.values())
