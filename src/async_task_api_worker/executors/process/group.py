"""A task's process group: started in a session of its own, killed whole, reaped.

Shared by the process executor and the Step Functions worker's subprocesses. The child leads
its own session, so its pid is its process group id: recorded at spawn, never looked up again
(after the child is reaped, the id could name someone else's group). :func:`end_group`
and :func:`log_tails` are the one way a task's process ends: its group killed and reaped, its
output drained, then logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Final

from async_task_api_worker.context import task_log_extra
from async_task_api_worker.executors.process.output import OutputTail

__all__ = [
    "GROUP_GONE_TIMEOUT_S",
    "REAP_TIMEOUT_S",
    "TaskProcess",
    "become_subreaper",
    "die_with_parent",
    "end_group",
    "log_tails",
    "signal_name",
    "spawn_in_new_session",
]

#: Seconds to wait for a killed child to be reaped.
REAP_TIMEOUT_S: Final = 5.0
#: Seconds to wait for the killed group's other processes to be reaped.
GROUP_GONE_TIMEOUT_S: Final = 1.0
#: Seconds an output pipe gets to reach its end once the group is dead.
OUTPUT_END_TIMEOUT_S: Final = 1.0

_PR_SET_PDEATHSIG: Final = 1
_PR_SET_CHILD_SUBREAPER: Final = 36


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(Exception):  # not Linux: the protection is simply not there
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)


def die_with_parent(signal_number: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``signal_number`` to this process when its parent dies.

    A no-op where there is no ``prctl`` (not Linux).
    """
    _prctl(_PR_SET_PDEATHSIG, signal_number)


def become_subreaper() -> None:
    """Make this process the parent of its orphaned descendants (Linux).

    It then reaps them: a task's killed grandchildren do not linger as zombies, whatever
    PID 1 does.
    """
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


class TaskProcess:
    """A started task process: its pid (also its process group id) and its exit code.

    Args:
        pid: the process id of a child that leads its own session (``setsid``).
        exited: resolves to its exit code (negative: killed by that signal).
    """

    def __init__(self, pid: int, exited: asyncio.Future[int]) -> None:
        self.pid = pid
        self.pgid = pid  # the child is a session leader: recorded here, never looked up again
        self.exited = exited
        self.killed = False

    def kill(self) -> None:
        """SIGKILL the whole group (a no-op once everything in it is gone)."""
        self.killed = True
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            if not self.exited.done():
                # Forked but not yet a session leader: the group does not exist yet.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)

    async def gone(self, timeout_s: float) -> bool:
        """Wait until no process of the group is left (reaped), at most ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                os.killpg(self.pgid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:  # the group id was reused by someone else's process
                return True
            if loop.time() >= deadline:
                return False
            # The kernel offers no event for "a group is empty": poll it, briefly.
            await asyncio.sleep(0.005)

    async def reap(self, timeout_s: float) -> int | None:
        """The exit code, waiting at most ``timeout_s``; ``None`` if not known by then."""
        try:
            return await asyncio.wait_for(asyncio.shield(self.exited), timeout_s)
        except TimeoutError:
            return None
        except Exception:  # the fork server that reports it is gone: unknown
            return None


def signal_name(code: int) -> str:
    """``SIGSEGV`` for the exit code ``-11``."""
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


async def spawn_in_new_session(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdout_fd: int,
    stderr_fd: int,
    pass_fds: Sequence[int] = (),
) -> TaskProcess:
    """Start ``argv`` in a new session (``start_new_session``), stdin closed.

    Raises:
        OSError: the program could not be started.
    """
    process = await asyncio.create_subprocess_exec(
        *argv,
        env=None if env is None else dict(env),
        pass_fds=tuple(pass_fds),
        stdin=subprocess.DEVNULL,
        stdout=stdout_fd,
        stderr=stderr_fd,
        start_new_session=True,
    )
    return TaskProcess(process.pid, asyncio.ensure_future(process.wait()))


async def end_group(child: TaskProcess | None, tails: Sequence[OutputTail]) -> None:
    """End a task's process: kill its whole group, reap it, and drain and close its pipes.

    Always called once the task is over, however it ended: leftovers of a finished task (a
    grandchild in the background) go with it. After the kill the pipes end, unless a process
    that left the group still holds them: that is not waited for.

    Args:
        child: the task's process, or ``None`` when it never started.
        tails: every output pipe of the task, closed here.
    """
    if child is not None:
        child.kill()
        if await child.reap(REAP_TIMEOUT_S) is not None:
            await child.gone(GROUP_GONE_TIMEOUT_S)
    for tail in tails:
        await tail.finish(OUTPUT_END_TIMEOUT_S)


def log_tails(
    tails: Sequence[OutputTail], *, task_id: str | None, level: int, logger: logging.Logger
) -> None:
    """Log what each pipe kept, redacted and from a line's start (``OutputTail.text``).

    Args:
        tails: the pipes whose tail goes to the log (never a result channel).
        task_id: the task the lines are about.
        level: DEBUG after a normal end; WARNING when the output is the clue to a crash.
        logger: where the lines go.
    """
    for tail in tails:
        if tail.data:
            logger.log(
                level,
                "The task's process wrote %d bytes to %s; the last ones: %s",
                tail.total,
                tail.name,
                tail.text(),
                extra=task_log_extra({"task_id": task_id}),
            )
