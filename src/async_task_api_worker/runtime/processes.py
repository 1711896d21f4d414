"""Several worker processes in one pod: ``run --processes N`` (``WORKER_PROCESSES`` above 1).

``run`` checks the target and the settings once (a bad one exits 2 with one line, before any
process starts), then supervises N worker processes, each a fresh ``run TARGET --processes 1``
with its own broker connection, in a session of its own (``runtime.supervised`` starts them):
a signal sent to the supervisor's process group reaches a worker process once, through it.

- **Probes.** The supervisor serves ``HEALTH_CHECK_HOST:HEALTH_CHECK_PORT``: ``/health`` is its
  own loop's; ``/ready`` is ready while it is not stopping and every worker process's own
  ``/ready`` (on a loopback socket the supervisor gave it) answers 200, asked on each request,
  so the rule of what makes a process ready stays the runner's. A failing one is named
  ``process-<n>``, with its own components.
- **Metrics.** The processes write prometheus-client's multiprocess files in a fresh
  directory; ``/metrics`` adds them up (``observability.processes.ProcessesMetrics``).
- **Signals.** SIGTERM or SIGINT goes on to every worker process as SIGTERM (both drain alike);
  a second one ends their grace periods. One still running a process's bound after the first
  signal has its process group SIGKILLed, and the reaping gets :data:`KILL_MARGIN_S`: ``run``
  ends within :func:`shutdown_bound_of`.
- **Restarts** (:class:`RestartPolicy`). A process that ends while the supervisor is not
  stopping starts again after 1 s, doubled with each death of that ``process-<n>``, at most
  30 s, back to 1 s once it had stayed up 60 s. Its fifth death within 60 s stops everything
  with exit 1 and one ERROR line. One that exits 2 (a configuration error) is not restarted:
  the others are stopped and the supervisor exits 2.
- **Exit code.** 2 if a worker process exited 2; else 1 if the restart rule gave up, a process
  could not start, or one ended otherwise than 0 during the stop (killed past the bound, a
  stuck handler); else 0. One ended by the forwarded SIGTERM before it installed its handler
  (it was starting) stopped cleanly.

The supervisor runs no hook and no handler; it imports the target once, as ``check`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from async_task_api_worker.errors import ConfigError
from async_task_api_worker.executors.process.group import signal_name
from async_task_api_worker.observability.logging import configure_logging
from async_task_api_worker.observability.probes import PROBE_TIMEOUT_S
from async_task_api_worker.observability.processes import fetch_readiness
from async_task_api_worker.observability.redaction import exception_type_name
from async_task_api_worker.runtime.exit_codes import ExitCode, say_error
from async_task_api_worker.runtime.supervised import (
    WorkerProcess,
    metrics_directory,
    spawn_worker_process,
)
from async_task_api_worker.settings import WorkerSettings

__all__ = ["KILL_MARGIN_S", "RestartPolicy", "Supervisor", "shutdown_bound_of", "supervise"]

_logger = logging.getLogger("async_task_api_worker.runtime")

#: Seconds past a process's shutdown bound for the supervisor to SIGKILL what is left and
#: reap it.
KILL_MARGIN_S: Final = 2.0
#: Seconds the supervisor waits for a worker process's ``/ready``: the process's own probe
#: hooks get :data:`PROBE_TIMEOUT_S`, then it answers.
CHILD_READY_TIMEOUT_S: Final = PROBE_TIMEOUT_S + 0.5
#: The restart rule (:class:`RestartPolicy`), in seconds and deaths.
RESTART_FIRST_DELAY_S: Final = 1.0
RESTART_MAX_DELAY_S: Final = 30.0
STABLE_AFTER_S: Final = 60.0
MAX_DEATHS: Final = 5
DEATH_WINDOW_S: Final = 60.0


def shutdown_bound_of(processes: int, process_bound_s: float) -> float:
    """The longest ``run`` takes from SIGTERM to its exit, in seconds.

    Args:
        processes: ``WORKER_PROCESSES``.
        process_bound_s: one worker process's bound (``runtime.entry.shutdown_bounds``).

    Returns:
        ``process_bound_s`` for one process; above one, plus :data:`KILL_MARGIN_S`.
    """
    return process_bound_s if processes == 1 else process_bound_s + KILL_MARGIN_S


@dataclass
class RestartPolicy:
    """When one worker process (one ``process-<n>``) is started again after it ended.

    The delay is ``first_delay_s`` after a death, doubled with each further death, at most
    ``max_delay_s``; a process that had stayed up ``stable_after_s`` starts the series again.
    The ``max_deaths``-th death within ``window_s`` gives up. Times are any one clock's, in
    seconds.
    """

    first_delay_s: float = RESTART_FIRST_DELAY_S
    max_delay_s: float = RESTART_MAX_DELAY_S
    stable_after_s: float = STABLE_AFTER_S
    max_deaths: int = MAX_DEATHS
    window_s: float = DEATH_WINDOW_S
    _deaths: deque[float] = field(default_factory=deque, repr=False)
    _delay_s: float | None = field(default=None, repr=False)

    def died(self, *, started_at: float, now: float) -> float | None:
        """Record that the process started at ``started_at`` ended at ``now``.

        Returns:
            The seconds to wait before starting it again, or ``None``: give up.
        """
        self._deaths.append(now)
        while self._deaths[0] <= now - self.window_s:
            self._deaths.popleft()
        if len(self._deaths) >= self.max_deaths:
            return None
        if self._delay_s is None or now - started_at >= self.stable_after_s:
            self._delay_s = self.first_delay_s
        else:
            self._delay_s = min(self._delay_s * 2, self.max_delay_s)
        return self._delay_s


Spawn = Callable[[int], Awaitable[WorkerProcess]]


@dataclass
class _Slot:
    index: int
    policy: RestartPolicy
    child: WorkerProcess | None = None
    started_at: float = 0.0
    restart_at: float | None = None

    @property
    def name(self) -> str:
        return f"process-{self.index}"


class Supervisor:
    """Keeps ``processes`` worker processes running until asked to stop (see the module).

    Args:
        processes: how many (``WORKER_PROCESSES``, above 1).
        process_bound_s: seconds from the first stop request to the SIGKILL of what still
            runs: one process's bound; the reaping then gets :data:`KILL_MARGIN_S`.
        spawn: starts the worker process numbered from 1; raises ``OSError`` when it cannot.
        policy: makes each process's restart rule.
        clock: seconds of a monotonic clock, for the restart rule.
        on_exit: told the pid of every worker process that ended.
    """

    def __init__(
        self,
        *,
        processes: int,
        process_bound_s: float,
        spawn: Spawn,
        policy: Callable[[], RestartPolicy] = RestartPolicy,
        clock: Callable[[], float] = time.monotonic,
        on_exit: Callable[[int], None] = lambda pid: None,
    ) -> None:
        self._slots = [_Slot(index, policy()) for index in range(1, processes + 1)]
        self._bound_s = process_bound_s
        self._spawn = spawn
        self._clock = clock
        self._on_exit = on_exit
        self._stopping = asyncio.Event()
        self._stop_requests = 0
        self._code = ExitCode.OK

    def pids(self) -> list[int]:
        """The pids of the worker processes running now."""
        return [slot.child.pid for slot in self._slots if slot.child is not None]

    def request_stop(self, reason: str = "requested") -> None:
        """Stop every worker process (SIGTERM); a second request ends their grace periods."""
        self._stop_requests += 1
        if self._stop_requests == 1:
            _logger.info("Shutdown requested (%s): stopping the worker processes", reason)
            self._stopping.set()
        elif self._stop_requests == 2:
            _logger.warning("Second shutdown request (%s): ending the grace periods", reason)
        for slot in self._slots:
            if slot.child is not None:
                slot.child.terminate()

    def readiness(self) -> dict[str, str]:
        """The supervisor's own failing components: ``draining``, processes not running."""
        if self._stopping.is_set():
            return {"draining": "the worker is shutting down"}
        now = self._clock()
        failing: dict[str, str] = {}
        for slot in self._slots:
            if slot.child is None and slot.restart_at is not None:
                failing[slot.name] = f"not running (restarting in {slot.restart_at - now:.0f} s)"
            elif slot.child is None:
                failing[slot.name] = "not running"
        return failing

    async def processes_readiness(self) -> dict[str, str]:
        """The running worker processes whose own ``/ready`` fails, and why."""
        if self._stopping.is_set():
            return {}
        running = [slot for slot in self._slots if slot.child is not None]
        answers = await asyncio.gather(*(self._ask(slot.child) for slot in running if slot.child))
        return {slot.name: why for slot, why in zip(running, answers, strict=True) if why}

    async def _ask(self, child: WorkerProcess) -> str | None:
        try:
            failing = await fetch_readiness(
                "127.0.0.1", child.probes_port, timeout_s=CHILD_READY_TIMEOUT_S
            )
        except ConnectionRefusedError:
            return "starting (its probes server is not listening yet)"
        except TimeoutError:
            return f"no answer within {CHILD_READY_TIMEOUT_S:g} s"
        except (OSError, ValueError) as exc:
            return f"its /ready failed ({exception_type_name(exc)})"
        return ", ".join(f"{name} ({why})" for name, why in sorted(failing.items())) or None

    async def run(self) -> ExitCode:
        """Start the processes, keep them running until a stop, then stop them in the bound.

        Returns:
            The exit code (see the module).
        """
        keepers = {asyncio.ensure_future(self._keep(slot)) for slot in self._slots}
        for keeper in keepers:
            keeper.add_done_callback(self._kept)
        await self._stopping.wait()
        _, left = await asyncio.wait(keepers, timeout=self._bound_s)
        if left:
            for slot in self._slots:
                if slot.child is not None:
                    _logger.error(
                        "Worker %s (pid %d) still runs %g s after the stop request: killing "
                        "its process group",
                        slot.name,
                        slot.child.pid,
                        self._bound_s,
                    )
                    slot.child.kill()
            self._code = max(self._code, ExitCode.FAILURE)
            _, left = await asyncio.wait(left, timeout=KILL_MARGIN_S)
            for keeper in left:
                keeper.cancel()
        return self._code

    def _kept(self, keeper: asyncio.Future[None]) -> None:
        error = None if keeper.cancelled() else keeper.exception()
        if error is not None:
            # A bug here must not leave the pod without its processes and nobody stopping.
            _logger.error("A worker process's keeper failed (%s)", exception_type_name(error))
            self._finish(ExitCode.FAILURE, "a keeper failed")

    def _finish(self, code: ExitCode, reason: str) -> None:
        self._code = max(self._code, code)
        self.request_stop(reason)

    async def _keep(self, slot: _Slot) -> None:
        while not self._stopping.is_set():
            try:
                child = await self._spawn(slot.index)
            except OSError as exc:
                _logger.error("Worker %s could not be started: %s", slot.name, exc)
                self._finish(ExitCode.FAILURE, f"{slot.name} could not be started")
                return
            slot.child, slot.started_at, slot.restart_at = child, self._clock(), None
            _logger.info(
                "Worker %s started (pid %d)", slot.name, child.pid, extra={"pid": child.pid}
            )
            if self._stopping.is_set():  # the stop came while it was being started
                child.terminate()
            code = await child.exited
            slot.child = None
            self._on_exit(child.pid)
            if self._stopping.is_set():
                self._stopped(slot, child.pid, code)
                return
            if code == ExitCode.CONFIG:
                _logger.error(
                    "Worker %s (pid %d) exited 2 (a configuration error): stopping the others",
                    slot.name,
                    child.pid,
                )
                self._finish(ExitCode.CONFIG, f"{slot.name} exited 2")
                return
            now = self._clock()
            delay_s = slot.policy.died(started_at=slot.started_at, now=now)
            if delay_s is None:
                _logger.error(
                    "Worker %s died %d times within %g s (the last: %s): giving up",
                    slot.name,
                    slot.policy.max_deaths,
                    slot.policy.window_s,
                    _ending(code),
                )
                self._finish(ExitCode.FAILURE, f"{slot.name} keeps dying")
                return
            _logger.warning(
                "Worker %s (pid %d) ended unexpectedly (%s) after %.1f s; restarting in %g s",
                slot.name,
                child.pid,
                _ending(code),
                now - slot.started_at,
                delay_s,
            )
            slot.restart_at = now + delay_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=delay_s)
            slot.restart_at = None

    def _stopped(self, slot: _Slot, pid: int, code: int) -> None:
        if code in (0, -signal.SIGTERM):
            _logger.info("Worker %s (pid %d) stopped (%s)", slot.name, pid, _ending(code))
            return
        _logger.warning("Worker %s (pid %d) ended: %s", slot.name, pid, _ending(code))
        self._code = max(
            self._code, ExitCode.CONFIG if code == ExitCode.CONFIG else ExitCode.FAILURE
        )


def _ending(code: int) -> str:
    return f"exit code {code}" if code >= 0 else f"killed by {signal_name(code)}"


def supervise(
    target: str, settings: WorkerSettings, *, process_bound_s: float, flags: Sequence[str] = ()
) -> ExitCode:
    """Run ``settings.worker_processes`` worker processes of ``target`` until SIGTERM/SIGINT.

    Args:
        target: ``my_module:worker``, checked already (each process loads it again).
        settings: the settings, checked already.
        process_bound_s: one process's shutdown bound (``runtime.entry.shutdown_bounds``).
        flags: ``run``'s setting flags but ``--processes`` (``["--concurrency", "4"]``), for each.

    Returns:
        The exit code (see the module). A configuration error (the probes port cannot be
        bound, no metrics directory) is one line on stderr and 2.
    """
    from async_task_api_worker.runtime.loops import run_on

    configure_logging(settings.log_level, log_format=settings.log_format)
    try:
        with metrics_directory() as directory:
            spawn = functools.partial(spawn_worker_process, target, directory, flags=flags)
            return run_on(
                settings.worker_event_loop, _supervise(spawn, settings, process_bound_s, directory)
            )
    except ConfigError as exc:
        say_error(exc)
        return ExitCode.CONFIG


async def _supervise(
    spawn: Spawn, settings: WorkerSettings, process_bound_s: float, directory: str
) -> ExitCode:
    from async_task_api_worker.observability.probes import ProbesServer, ReadinessCheck
    from async_task_api_worker.observability.processes import ProcessesMetrics
    from async_task_api_worker.runtime.observed import start_probes
    from async_task_api_worker.runtime.signals import shutdown_on_signals

    def running() -> list[int]:
        return supervisor.pids()

    metrics = ProcessesMetrics(directory, running)
    supervisor = Supervisor(
        processes=settings.worker_processes,
        process_bound_s=process_bound_s,
        spawn=spawn,
        on_exit=metrics.process_dead,
    )
    server = ProbesServer(
        host=settings.health_check_host,
        port=settings.health_check_port,
        readiness=ReadinessCheck(
            supervisor.readiness, {}, delegated=supervisor.processes_readiness
        ),
        metrics=metrics.exposition,
    )
    await start_probes(server, settings)
    _logger.info(
        "Supervising %d worker processes (--processes / WORKER_PROCESSES); shutdown bound %g s",
        settings.worker_processes,
        shutdown_bound_of(settings.worker_processes, process_bound_s),
    )
    try:
        with shutdown_on_signals(supervisor.request_stop):
            code = await supervisor.run()
    finally:
        await server.close()
    _logger.info("Worker processes stopped (exit code %d)", code)
    return code
