"""Handlers the detached-worker tests run (module level: the worker imports them)."""

from __future__ import annotations

import time
from pathlib import Path
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


def gated(message: dict[str, Any]) -> dict[str, Any]:
    """Wait until the file ``gate`` exists (60 s at most): the test decides when it ends.

    Creates the file ``running``, if given, first: the worker is past its start-up.
    """
    if "running" in message:
        Path(message["running"]).touch()
    gate = Path(message["gate"])
    deadline = time.monotonic() + 60.0
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # the gate is a file the test writes from another process
    return {"gated": gate.exists()}
