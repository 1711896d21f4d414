"""The link between a supervisor (``runtime.processes``) and each worker process it starts.

Both halves live here, so that they cannot drift: :func:`spawn_worker_process` is how the
supervisor starts one, and :func:`child_link` with :func:`become_child` is what ``run`` does
with it in that process. The link is :data:`PROCESS_ENV` (``INDEX:FD:SUPERVISOR_PID``), a
loopback socket bound by the supervisor and passed down as that descriptor (the process
serves its probes on it; bound but not listening, so ``/ready`` is refused at once until the
process serves it), and ``PROMETHEUS_MULTIPROC_DIR`` for its metrics.

Kept free of heavy imports: every ``run`` reads :func:`child_link`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Final, Protocol

from async_task_api_worker.errors import SettingsError
from async_task_api_worker.runtime.signals import SUPERVISOR_GONE, drain_once_on

__all__ = [
    "PROCESS_ENV",
    "ChildLink",
    "StartedProcess",
    "WorkerProcess",
    "become_child",
    "child_link",
    "metrics_directory",
    "spawn_worker_process",
]

#: The variable that makes ``run`` a supervised worker process.
PROCESS_ENV: Final = "ASYNC_TASK_API_WORKER_PROCESS"


class ChildLink:
    """What a supervised worker process got from its supervisor.

    Args:
        index: its number, from 1 (``process-<n>``; its log records carry it as
            ``worker_process``).
        probes_fd: the descriptor of the bound loopback socket its probes server serves.
        supervisor_pid: the process it is the worker process of.
    """

    # A plain class: every `run` reads the link, and a dataclass costs a millisecond to define.
    __slots__ = ("index", "probes_fd", "supervisor_pid")

    def __init__(self, index: int, probes_fd: int, supervisor_pid: int) -> None:
        self.index = index
        self.probes_fd = probes_fd
        self.supervisor_pid = supervisor_pid


def child_link() -> ChildLink | None:
    """This process's link to its supervisor, or ``None`` when it has none (a plain ``run``).

    Raises:
        SettingsError: :data:`PROCESS_ENV` is set but malformed (set by hand?).
    """
    value = os.environ.get(PROCESS_ENV)
    if value is None:
        return None
    try:
        index, fd, pid = (int(part) for part in value.split(":"))
    except ValueError:
        raise SettingsError(
            f"invalid setting {PROCESS_ENV}: set by the supervisor only, as INDEX:FD:PID"
        ) from None
    return ChildLink(index, fd, pid)


def become_child(link: ChildLink) -> socket.socket | None:
    """Make this process a supervised worker process.

    It drains when its supervisor dies (Linux's ``PR_SET_PDEATHSIG``, with the signal of
    ``runtime.signals.SUPERVISOR_GONE``, taken once): no worker process outlives a supervisor
    killed with SIGKILL, and none loses its grace period to it. Its log records carry
    ``worker_process`` (``link.index``).

    Returns:
        The probes socket to serve, or ``None`` when the supervisor is gone already.
    """
    from async_task_api_worker.executors.process.group import die_with_parent

    drain_once_on(SUPERVISOR_GONE)
    die_with_parent(SUPERVISOR_GONE)
    if os.getppid() != link.supervisor_pid:  # it died before the request took hold
        return None
    # The link is this process's alone: a program a handler starts is no worker process.
    os.environ.pop(PROCESS_ENV, None)
    previous = logging.getLogRecordFactory()

    def with_index(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.worker_process = link.index
        return record

    logging.setLogRecordFactory(with_index)
    probes = socket.socket(fileno=link.probes_fd)
    probes.set_inheritable(False)
    return probes


class WorkerProcess(Protocol):
    """A started worker process, as the supervisor (``runtime.processes``) handles it."""

    pid: int
    exited: asyncio.Future[int]
    """Resolves to its exit code (negative: the signal that ended it)."""
    probes_port: int
    """The loopback port its probes server serves."""

    def terminate(self) -> None:
        """Send it SIGTERM (a no-op once it is gone)."""

    def kill(self) -> None:
        """SIGKILL its whole process group."""


class StartedProcess:
    """A :class:`WorkerProcess` started in a session of its own.

    Args:
        pid: its pid, also its process group's id.
        exited: resolves to its exit code (negative: the signal that ended it).
        kill: SIGKILLs its whole process group.
        probes_port: the loopback port of its probes socket.
    """

    def __init__(
        self, pid: int, exited: asyncio.Future[int], kill: Callable[[], None], probes_port: int
    ) -> None:
        self.pid = pid
        self.exited = exited
        self.probes_port = probes_port
        self._kill = kill

    def terminate(self) -> None:
        """Send it SIGTERM; a no-op once it is gone."""
        # The pid is its own until the supervisor reaps it, and a reaped one is never signalled
        # (the supervisor forgets it first).
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL its whole process group (what the process itself started included)."""
        self._kill()


@contextlib.contextmanager
def metrics_directory() -> Iterator[str]:
    """A fresh ``PROMETHEUS_MULTIPROC_DIR`` for the worker processes, removed afterwards.

    Raises:
        SettingsError: it cannot be made (``TMPDIR`` names the place).
    """
    import shutil
    import tempfile

    try:
        directory = tempfile.mkdtemp(prefix="async-task-api-worker-metrics-")
    except OSError as exc:
        raise SettingsError(
            f"invalid setting WORKER_PROCESSES: no metrics directory in {tempfile.gettempdir()} "
            f"({exc.strerror or type(exc).__name__}; TMPDIR names another)"
        ) from None
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def spawn_worker_process(
    target: str, metrics_dir: str, index: int, *, flags: Sequence[str] = ()
) -> StartedProcess:
    """Start worker process number ``index`` of ``target``, its output on this one's.

    ``python -m async_task_api_worker run TARGET FLAGS --processes 1`` in a session of its own,
    with this environment plus the link (:data:`PROCESS_ENV`, ``PROMETHEUS_MULTIPROC_DIR``,
    ``WORKER_PROCESSES=1``). ``flags`` are the setting flags the supervisor was given.

    Raises:
        OSError: it could not be started (or no loopback port could be bound).
    """
    from async_task_api_worker.executors.process.group import spawn_in_new_session

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probes:
        probes.bind(("127.0.0.1", 0))
        env = dict(os.environ)
        env.update(
            {
                PROCESS_ENV: f"{index}:{probes.fileno()}:{os.getpid()}",
                "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
                "WORKER_PROCESSES": "1",
            }
        )
        argv = [
            *(sys.executable, "-m", "async_task_api_worker", "run", target),
            *flags,
            *("--processes", "1"),
        ]
        started = await spawn_in_new_session(
            argv, env=env, stdout_fd=1, stderr_fd=2, pass_fds=(probes.fileno(),)
        )
        return StartedProcess(started.pid, started.exited, started.kill, probes.getsockname()[1])
