"""ECS task protection: keep ECS from stopping the task while a message is being handled.

The ECS agent's endpoint ``$ECS_AGENT_URI/task-protection/v1/state`` (AWS, "Protecting your
Amazon ECS tasks from being terminated by scale-in events"): ``PUT {"ProtectionEnabled": true,
"ExpiresInMinutes": N}`` to protect, ``{"ProtectionEnabled": false}`` to release. Every call
has a short timeout and never raises: a failure (the agent answers 200 with ``failure`` for a
task outside a service, a 5xx, no answer) is logged and the message is handled anyway, since
protection guards against an interruption, not against a wrong result. Without
``ECS_AGENT_URI`` (not on ECS) the client does nothing, and says so once.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import math
import os
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Final

__all__ = [
    "MAX_EXPIRES_IN_MINUTES",
    "ProtectionLease",
    "TaskProtection",
    "protection_minutes",
    "renew_period_s",
]

_logger = logging.getLogger("async_task_api_worker.transports.sqs_sfn.protection")

#: The longest protection ECS grants at once (48 hours).
MAX_EXPIRES_IN_MINUTES: Final = 2880
#: Seconds one call to the agent may take.
CALL_TIMEOUT_S: Final = 2.0


class TaskProtection:
    """The ECS agent's task-protection endpoint.

    Args:
        agent_uri: the agent's URI; default ``$ECS_AGENT_URI``. ``None`` or empty: a no-op.
        timeout_s: seconds each call may take.
    """

    def __init__(self, agent_uri: str | None = None, *, timeout_s: float = CALL_TIMEOUT_S) -> None:
        uri = agent_uri if agent_uri is not None else os.environ.get("ECS_AGENT_URI", "")
        self._url = f"{uri.rstrip('/')}/task-protection/v1/state" if uri else None
        self._timeout_s = timeout_s
        if self._url is None:
            _logger.info("ECS_AGENT_URI is not set: task protection is off (not on ECS)")

    @property
    def enabled(self) -> bool:
        """Whether there is an agent to call."""
        return self._url is not None

    def enable(self, expires_in_minutes: int) -> bool:
        """Protect the task for ``expires_in_minutes`` (at most 2,880); ``True`` if granted."""
        minutes = max(1, min(MAX_EXPIRES_IN_MINUTES, int(expires_in_minutes)))
        return self._put({"ProtectionEnabled": True, "ExpiresInMinutes": minutes})

    def disable(self) -> bool:
        """Release the protection; ``True`` if the agent confirmed."""
        return self._put({"ProtectionEnabled": False})

    def _put(self, state: dict[str, object]) -> bool:
        if self._url is None:
            return False
        what = "enable" if state["ProtectionEnabled"] else "disable"
        request = urllib.request.Request(  # noqa: S310 - the agent's URI, from ECS
            self._url,
            data=json.dumps(state).encode(),
            method="PUT",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as answer:  # noqa: S310
                body = json.loads(answer.read() or b"{}")
        except (OSError, ValueError, http.client.HTTPException) as exc:
            _logger.warning(
                "Could not %s ECS task protection (%s); going on without it",
                what,
                type(exc).__name__,
            )
            return False
        if isinstance(body, dict) and body.get("failure"):
            failure = body["failure"]
            reason = failure.get("Reason") if isinstance(failure, dict) else failure
            _logger.warning(
                "ECS refused to %s task protection (%s); going on without it", what, reason
            )
            return False
        return True


def protection_minutes(timeout_s: float) -> int:
    """Minutes of protection asked for a task of ``timeout_s`` seconds: its budget plus one.

    At most ECS's cap (2,880); a longer task gets it renewed before it runs out.
    """
    return min(MAX_EXPIRES_IN_MINUTES, math.ceil(timeout_s / 60.0) + 1)


def renew_period_s(minutes: int) -> float:
    """Seconds between two renewals of a protection of ``minutes``: a minute before it ends."""
    return max(60.0, (minutes - 1) * 60.0)


class ProtectionLease:
    """ECS task protection held while any delivery is in hand (seed 000, invariant 4).

    ECS protects a whole task, not a message: the first delivery in hand enables protection,
    the last one released disables it, and while it is held it is renewed a minute before it
    would run out. Each call goes through ``run`` (a thread: the agent's HTTP calls block).

    Args:
        protection: the agent's endpoint.
        minutes: minutes asked at each enable (:func:`protection_minutes`).
        run: runs a blocking call off the event loop.
        renew_period_s: seconds between two renewals; default :attr:`renew_period_s`.
    """

    def __init__(
        self,
        protection: TaskProtection,
        minutes: int,
        run: Callable[[Callable[[], bool]], Awaitable[bool]],
        *,
        renew_period_s: float | None = None,
    ) -> None:
        self.protection = protection
        self.minutes = minutes
        self._run = run
        self._renew_s = renew_period_s
        self._held = 0
        self._closed = False
        self._lock = asyncio.Lock()
        self._renewing: asyncio.Task[None] | None = None

    @property
    def renew_period_s(self) -> float:
        """Seconds between two renewals: a minute before the protection runs out."""
        return self._renew_s if self._renew_s is not None else renew_period_s(self.minutes)

    async def acquire(self) -> None:
        """One more delivery in hand: protect the task if none was."""
        async with self._lock:
            self._held += 1
            if self._held == 1 and self.protection.enabled:
                await self._run(lambda: self.protection.enable(self.minutes))
                self._renewing = asyncio.ensure_future(self._renew())

    async def release(self) -> None:
        """One delivery less: release the protection once none is left. Never raises."""
        async with self._lock:
            self._held = max(0, self._held - 1)
            if self._held or self._closed or not self.protection.enabled:
                return
            await self._stop_renewing()
            await self._run(self.protection.disable)

    async def _stop_renewing(self) -> None:
        renewing, self._renewing = self._renewing, None
        if renewing is not None:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.renew_period_s)
            await self._run(lambda: self.protection.enable(self.minutes))

    async def close(self) -> None:
        """Stop renewing and release whatever is held (the transport is closing)."""
        async with self._lock:
            held, self._held = self._held, 0
            self._closed = True
            await self._stop_renewing()
            if held and self.protection.enabled:
                await self._run(self.protection.disable)
