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

import http.client
import json
import logging
import os
import urllib.error
import urllib.request
from typing import Final

__all__ = ["MAX_EXPIRES_IN_MINUTES", "TaskProtection"]

_logger = logging.getLogger("async_task_api_worker.sfn.protection")

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
