"""A task's process group: started in a session of its own, killed whole, reaped.

Shared by the process executor and the Step Functions worker. The child leads its own session,
so its pid is its process group id: recorded at spawn, never looked up again (after the child
is reaped, the id could name someone else's group).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

__all__ = ["TaskProcess", "signal_name", "spawn_in_new_session"]


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
