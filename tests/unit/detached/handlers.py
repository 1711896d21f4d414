"""Handlers the detached-worker tests run (module level: the worker imports them)."""

from __future__ import annotations

import time
from typing import Any

from async_task_api_worker import FatalError


def quick(message: dict[str, Any]) -> dict[str, Any]:
    """Echo the message."""
    return {"echo": message}


def slow(message: dict[str, Any]) -> dict[str, Any]:
    """Sleep ``seconds``."""
    time.sleep(float(message["seconds"]))
    return {"slept": message["seconds"]}


def crash(message: dict[str, Any]) -> dict[str, Any]:
    """Fail with a secret in the exception."""
    raise ValueError("secret hunter2")


def refuse(message: dict[str, Any]) -> dict[str, Any]:
    """Fail on purpose, with a code."""
    raise FatalError("NOT_ALLOWED", "No.")
