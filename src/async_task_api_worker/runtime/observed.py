"""The probes server and the event-loop lag watch, around a runner's whole life.

Source: seed "Probes, metrics and logs": the server runs from the very start of the process
(before the startup hooks and the connection) until the end of the shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

from async_task_api_worker.errors import SettingsError
from async_task_api_worker.observability.loop_lag import watch_loop_lag
from async_task_api_worker.observability.probes import ProbesServer, ReadinessCheck
from async_task_api_worker.runtime.runner import Runner
from async_task_api_worker.setting_flags import named
from async_task_api_worker.settings import WorkerSettings

__all__ = ["probes_for", "serving_probes", "start_probes"]


def probes_for(runner: Runner, *, sock: socket.socket | None = None) -> ProbesServer:
    """The probes server of ``runner``: its readiness, its worker's probe hooks, its metrics.

    Args:
        runner: the runner.
        sock: a bound socket to serve on instead of ``HEALTH_CHECK_HOST:PORT`` (a worker
            process under a supervisor, ``runtime.processes``).
    """
    settings = runner.settings
    return ProbesServer(
        host=settings.health_check_host,
        port=settings.health_check_port,
        readiness=ReadinessCheck(runner.readiness, runner.worker.readiness_probes),
        metrics=runner.metrics.exposition,
        sock=sock,
    )


async def start_probes(server: ProbesServer, settings: WorkerSettings) -> None:
    """Start ``server``, which listens on ``HEALTH_CHECK_HOST:HEALTH_CHECK_PORT``.

    Raises:
        SettingsError: it cannot listen there (in use, or not an address of this host).
    """
    try:
        await server.start()
    except OSError as exc:
        raise SettingsError(
            f"HEALTH_CHECK_HOST/{named('HEALTH_CHECK_PORT')}: cannot listen on "
            f"{settings.health_check_host}:{settings.health_check_port} "
            f"({exc.strerror or type(exc).__name__})"
        ) from exc


@contextlib.asynccontextmanager
async def serving_probes(
    runner: Runner, *, sock: socket.socket | None = None
) -> AsyncIterator[ProbesServer]:
    """Serve ``runner``'s probes and watch the loop's lag while the block runs.

    Args:
        runner: the runner.
        sock: see :func:`probes_for`.

    Raises:
        SettingsError: the probes server cannot listen on ``HEALTH_CHECK_HOST:PORT`` (in use,
            or not an address of this host).
    """
    server = probes_for(runner, sock=sock)
    await start_probes(server, runner.settings)
    watching = asyncio.ensure_future(watch_loop_lag(runner.metrics.set_loop_lag))
    try:
        yield server
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        await server.close()
