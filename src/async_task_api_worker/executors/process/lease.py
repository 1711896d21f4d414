"""The lease of a task's process group (``ports.Lease``): both halves.

A worker frozen by SIGSTOP, a paused VM or an event loop a handler blocks cannot kill its
tasks' processes, while the broker, having taken the silent worker for dead, hands their tasks
to another worker. So each task's group holds a lease its worker renews: one byte
(:data:`RENEWAL`) every ``Lease.renew_every_s``, on the task's channel (a process-isolated
task) or on a pipe (a Step Functions subprocess), from one loop per executor
(:class:`LeaseKeeper`), and only while the worker holds its deliveries (``Transport.holding``).

In the group, a watchdog (:func:`fence`) stops the whole group with SIGKILL once no renewal came
for ``Lease.expiry_s``, or as soon as the worker's end closes (it died). The watchdog is a small
process of the group's own, forked before the handler runs, not a thread: it needs no lock of
the handler's interpreter (a C extension holding the GIL cannot delay it), and the handler's
process stays single-threaded (``os.fork`` in a handler does not warn). The worker applies the
same rule to its own side (:attr:`Grant.lapsed`): a run whose renewals stopped for the expiry
is void, whatever its process concluded, and it is killed if it still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import time
from collections.abc import Callable

from async_task_api_worker.executors.process.group import die_with_parent
from async_task_api_worker.ports import Lease

__all__ = ["RENEWAL", "Grant", "LeaseKeeper", "fence", "unfence"]

_logger = logging.getLogger("async_task_api_worker.executors.process")

#: What the worker sends for one renewal.
RENEWAL = b"."


# ---------------------------------------------------------------------------- the task's group


def fence(fd: int, expiry_s: float) -> int:
    """Fork the group's watchdog, which reads the worker's renewals on ``fd``.

    Call it in the group's first process, before the handler runs (and before any thread
    starts); the watchdog is in the caller's process group. Once no renewal came for
    ``expiry_s`` seconds, or the worker's end of ``fd`` closed (it died), it sends SIGKILL to
    the whole group, itself included. When the caller dies first, the watchdog goes with it
    (Linux's parent death signal), so that it holds ``fd`` no longer than the caller does.

    Returns:
        The watchdog's pid, for :func:`unfence` once the caller's work is done.

    Raises:
        OSError: the watchdog could not be forked.
    """
    parent = os.getpid()
    watchdog = os.fork()
    if watchdog != 0:
        return watchdog
    die_with_parent()
    if os.getppid() != parent:  # the caller ended before the request took hold
        os._exit(0)
    try:
        _watch(fd, expiry_s)
    finally:
        os.killpg(0, signal.SIGKILL)
        os._exit(0)  # not reached: SIGKILL has no handler


def unfence(watchdog: int) -> None:
    """End and reap the watchdog :func:`fence` forked: the caller's work is done.

    Reaped here, the watchdog leaves nothing in the group for the worker to wait for.
    """
    with contextlib.suppress(ProcessLookupError):
        os.kill(watchdog, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):  # the handler set SIGCHLD to SIG_IGN
        os.waitpid(watchdog, 0)


def _watch(fd: int, expiry_s: float) -> None:
    """Return once ``fd`` went ``expiry_s`` seconds without a byte, or reached its end."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + expiry_s
    while (left_s := deadline - time.monotonic()) > 0:
        if not poller.poll(max(1, int(left_s * 1000) + 1)):
            continue  # the deadline is checked again: a poll may end early
        try:
            renewed = os.read(fd, 4096)
        except InterruptedError:
            continue
        except OSError:
            return  # the worker's end is broken: it is gone
        if not renewed:
            return  # the worker closed its end: it is gone
        deadline = time.monotonic() + expiry_s


# ---------------------------------------------------------------------------- the worker's side


class Grant:
    """One task group's share of the lease, kept by a :class:`LeaseKeeper`.

    Renewed from :meth:`start` (the group got its lease with its request) until
    :meth:`end` (the worker saw the run end: its answer, its exit, its deadline).

    Attributes:
        renewed_at: when a renewal last went to the group (``time.monotonic()``), or ``None``
            before :meth:`start`.
    """

    __slots__ = ("_ended", "_expiry_s", "_renew", "_revoke", "renewed_at")

    def __init__(self, expiry_s: float | None) -> None:
        self._expiry_s = expiry_s
        self._renew: Callable[[], None] | None = None
        self._revoke: Callable[[], None] | None = None
        self._ended: bool | None = None
        self.renewed_at: float | None = None

    def start(self, renew: Callable[[], None], revoke: Callable[[], None]) -> None:
        """Renew from now on.

        Args:
            renew: sends the group one renewal (raises ``OSError`` when it cannot).
            revoke: stops the group (SIGKILL to it), called once if the grant lapses.
        """
        self._renew, self._revoke = renew, revoke
        self.renewed_at = time.monotonic()

    @property
    def lapsed(self) -> bool:
        """Whether a renewal went missing for the expiry while the run lasted.

        The group then stopped itself (or must stop): whatever it concluded is void. Once
        true, it stays true (a lapsed grant is never renewed again); after :meth:`end`, it
        says what it said then.
        """
        if self._ended is not None:
            return self._ended
        renewed_at, expiry_s = self.renewed_at, self._expiry_s
        return (
            renewed_at is not None
            and expiry_s is not None
            and time.monotonic() - renewed_at >= expiry_s
        )

    def end(self) -> None:
        """The run ended (its answer or its end is known): renew no more, and keep the verdict."""
        if self._ended is None:
            self._ended = self.lapsed
            self._renew = self._revoke = None

    def tick(self, held: bool) -> None:
        """One turn of the keeper: renew, if ``held`` and not lapsed; revoke once lapsed."""
        if self._ended is not None:
            return
        if self.lapsed:
            revoke, self._revoke = self._revoke, None
            if revoke is not None:
                # Its watchdog has stopped it, unless it was held up itself: stop it here too.
                revoke()
            return
        if held and self._renew is not None:
            try:
                self._renew()
            except OSError:
                return  # the group is gone: its end is the executor's to see
            self.renewed_at = time.monotonic()


class LeaseKeeper:
    """Renews the lease of every task group of one executor, from one loop.

    Args:
        lease: the lease's terms; ``None``: no lease (every grant is a no-op that never lapses).
    """

    def __init__(self, lease: Lease | None) -> None:
        self._lease = lease
        self._grants: set[Grant] = set()
        self._loop_task: asyncio.Task[None] | None = None

    @property
    def expiry_s(self) -> float | None:
        """The lease's expiry, in seconds, for the group's watchdog; ``None`` without a lease."""
        return None if self._lease is None else self._lease.expiry_s

    def grant(self) -> Grant:
        """A grant for one task group, renewed from :meth:`Grant.start` (call on the loop)."""
        grant = Grant(self.expiry_s)
        if self._lease is not None:
            self._grants.add(grant)
            if self._loop_task is None or self._loop_task.done():
                self._loop_task = asyncio.get_running_loop().create_task(self._renew_all())
        return grant

    def release(self, grant: Grant) -> None:
        """End ``grant`` (:meth:`Grant.end`) and forget it; idempotent."""
        first = grant in self._grants
        self._grants.discard(grant)
        grant.end()
        if first and grant.lapsed:
            _logger.warning(
                "The task's process group went %g s without a renewal of its lease (this "
                "worker was frozen, blocked, or not holding its deliveries): it stopped "
                "itself, whatever it concluded is void, and its delivery goes back",
                self.expiry_s,
            )

    async def _renew_all(self) -> None:
        assert self._lease is not None  # noqa: S101 - started only with a lease
        lease = self._lease
        held = True
        while self._grants:
            # Not held at the last look: look again soon. The first look after a freeze finds
            # the link silent, its frames still unread; waiting a whole period for the next
            # look would cost the lease a second period.
            await asyncio.sleep(lease.renew_every_s if held else min(lease.renew_every_s, 0.1))
            try:
                held = lease.held()
            except Exception:
                _logger.exception("Cannot tell whether the worker holds its deliveries")
                held = False
            for grant in list(self._grants):
                grant.tick(held)

    async def aclose(self) -> None:
        """Stop renewing (the executor is closing)."""
        self._grants.clear()
        task, self._loop_task = self._loop_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
