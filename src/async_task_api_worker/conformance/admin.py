"""What the kit asks of the broker's operator tool: a policy, and a queue's unacked count.

Two cases need more than AMQP. To see that a worker acks only after its terminal report, the
kit holds the output queue to one message (a ``max-length`` policy with ``reject-publish``,
sized by :func:`hold_length`) and reads the vhost's unacknowledged deliveries, which AMQP does
not report. To see that a worker rejects a body rather than acking it, the kit gives the input
queue a dead-letter exchange of its own (a ``dead-letter-exchange`` policy). All go through
``rabbitmqctl`` (the broker's own CLI: ``set_policy``, ``clear_policy``, ``list_channels``),
scoped to the worker's vhost and to one queue name; without it, the first case is skipped and
the second notes what it did not check. Run the worker under test in a vhost of its own: the
unacked count is the vhost's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import sys
from dataclasses import dataclass
from typing import Final

__all__ = ["HOLD_POLICY", "REAP_S", "Admin", "AdminError", "hold_length", "release_at_end"]

#: The name of the kit's temporary policy, the hold or the dead-letter target (one at a time,
#: removed at the end of its case whatever happens): one ``release`` removes what a killed run
#: left.
HOLD_POLICY: Final = "atw-conformance-hold"
#: Above any policy an operator sets: a queue takes the one policy of highest priority.
_HOLD_PRIORITY: Final = 999
#: How often, and how far apart in s, a case's end tries to remove the policy: a broker that
#: restarts is down for a few seconds.
_RELEASE_TRIES: Final = 5
_RELEASE_PAUSE_S: Final = 1.0
#: Seconds a cancelled call waits for its killed process group to be reaped.
REAP_S: Final = 2.0


def hold_length(queue_type: str) -> int | None:
    """The ``max-length`` under which a queue of ``queue_type`` takes one message, refuses more.

    With ``overflow`` ``reject-publish``, a classic queue refuses a publish once it holds its
    limit; a quorum queue only once it holds more than its limit, so it takes one message more.

    Returns:
        1 for ``classic``, 0 for ``quorum``; ``None`` for another type (a stream has no such
        limit), which cannot be held so.
    """
    return {"classic": 1, "quorum": 0}.get(queue_type)


class AdminError(RuntimeError):
    """``rabbitmqctl`` failed; the message names the call and quotes its last line."""


@dataclass(frozen=True, slots=True)
class Admin:
    """``rabbitmqctl`` (``command``, split like a shell word list) for the vhost ``vhost``."""

    command: str
    vhost: str

    async def _call(self, *arguments: str) -> str:
        argv = [*shlex.split(self.command), *arguments]
        try:
            # A session of its own: rabbitmqctl is a script whose children (the Erlang VM, a
            # chroot's) hold the pipes, so a cancel must end the whole group.
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:  # not found, not executable
            raise AdminError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from exc
        try:
            out, err = await process.communicate()
        except asyncio.CancelledError:  # a caller's bound ran out (``inspect``): leave no child
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            # Reaped, its pipes read to their end and closed: nothing left running or open.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.communicate(), REAP_S)
            raise
        if process.returncode != 0:
            last = (err or out).decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise AdminError(f"{' '.join(argv[-len(arguments) :])} failed: {last[0][:200]}")
        return out.decode(errors="replace")

    async def hold(self, queue: str, max_length: int) -> None:
        """Make ``queue`` refuse publishes past ``max_length`` (``reject-publish``).

        ``max_length``: from :func:`hold_length`, for the queue's type.
        """
        await self._set_policy(queue, {"max-length": max_length, "overflow": "reject-publish"})

    async def dead_letter(self, queue: str, exchange: str) -> None:
        """Dead-letter what ``queue`` rejects to ``exchange`` (a ``dead-letter-exchange`` policy).

        A quorum queue dead-letters at most once by default, which needs no other key.
        """
        await self._set_policy(queue, {"dead-letter-exchange": exchange})

    async def _set_policy(self, queue: str, definition: dict[str, object]) -> None:
        await self._call(
            "set_policy",
            "-p",
            self.vhost,
            "--apply-to",
            "queues",
            "--priority",
            str(_HOLD_PRIORITY),
            HOLD_POLICY,
            f"^{re.escape(queue)}$",
            json.dumps(definition),
        )

    async def holding(self, queue: str) -> bool:
        """Whether the hold policy is in force on ``queue`` (``list_queues ... policy``)."""
        out = await self._call(
            "list_queues", "-q", "--no-table-headers", "-p", self.vhost, "name", "policy"
        )
        return any(line.split("\t")[:2] == [queue, HOLD_POLICY] for line in out.splitlines())

    async def release(self) -> None:
        """Remove the kit's policy, the hold or the dead-letter target (a no-op: none)."""
        try:
            await self._call("clear_policy", "-p", self.vhost, HOLD_POLICY)
        except AdminError as exc:
            # 3.10 and 4.0 say "Parameter does not exist"; older ones "not found".
            if not any(words in str(exc).lower() for words in ("not found", "does not exist")):
                raise

    async def consumer_tags(self, queue: str) -> list[str]:
        """The tags of ``queue``'s consumers (``list_consumers``), for ``inspect``.

        Raises:
            AdminError: the call failed.
        """
        out = await self._call(
            "list_consumers",
            "-q",
            "--no-table-headers",
            "-p",
            self.vhost,
            "queue_name",
            "consumer_tag",
        )
        return [
            parts[1]
            for line in out.splitlines()
            if len(parts := line.split("\t")) >= 2 and parts[0] == queue
        ]

    async def unacked(self) -> int:
        """The vhost's deliveries not yet acked, summed over its channels (``list_channels``).

        Channels count as deliveries happen; a quorum queue's own ``messages_unacknowledged``
        lags by the broker's statistics interval.

        Raises:
            AdminError: the call failed.
        """
        out = await self._call(
            "list_channels", "-q", "--no-table-headers", "vhost", "messages_unacknowledged"
        )
        unacked = 0
        for line in out.splitlines():
            parts = line.split("\t")
            if len(parts) >= 2 and parts[0] == self.vhost and parts[1].strip().isdigit():
                unacked += int(parts[1])
        return unacked


async def release_at_end(admin: Admin, *, was_set: bool) -> None:
    """Remove the kit's policy at a case's end, trying again while the broker is down.

    If every try fails, one line on stderr says the policy may be left and what removes it
    (the next run does: ``run_battery`` releases first); the case's verdict stands.
    ``was_set``: the case asked for its policy (else one silent try: a rabbitmqctl that never
    worked is not retried nor reported at every case).
    """
    for attempt in range(_RELEASE_TRIES if was_set else 1):
        try:
            await admin.release()
        except AdminError:
            if attempt + 1 < _RELEASE_TRIES:
                await asyncio.sleep(_RELEASE_PAUSE_S)
        else:
            return
    if not was_set:
        return
    vhost = shlex.quote(admin.vhost)
    print(
        f"async-task-api-worker: the policy {HOLD_POLICY} may be left in vhost {admin.vhost!r}: "
        f"the next run removes it (or rabbitmqctl clear_policy -p {vhost} {HOLD_POLICY})",
        file=sys.stderr,
    )
