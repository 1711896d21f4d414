"""Helpers of the detached-worker tests: bounded waits, a recording sender, clocks to step."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY

from async_task_api_worker.detached.claims import process_start_time
from async_task_api_worker.detached.state import Clocks
from tests.polling import wait_for

HANDLERS = "tests.unit.detached.handlers"
UNREADABLE = "worker_detached_unreadable_files_total"


def wait_until(predicate: Callable[[], object], timeout_s: float = 30.0) -> None:
    """Wait until ``predicate()`` is true (a detached worker's files or process, which another
    process changes), at most ``timeout_s`` seconds (then fail)."""
    wait_for(predicate, timeout_s, "a detached worker's state")


class Inbox:
    """A ``send_result`` that records what it was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def __call__(self, correlation_id: str, result: dict[str, Any]) -> None:
        with self._lock:
            self.sent.append((correlation_id, result))

    def ids(self) -> list[str]:
        """The correlation ids sent, in order."""
        return [correlation_id for correlation_id, _ in self.sent]


def marker_of(state: Path, correlation_id: str) -> dict[str, Any]:
    """The marker file of ``correlation_id``, as JSON."""
    return dict(json.loads((state / f"{correlation_id}.running").read_text()))


def fixed_clocks(boot: float, wall: float, this_boot: str = "boot-1") -> Clocks:
    """Clocks that stand still at ``boot`` and ``wall``."""
    return Clocks(boot=lambda: boot, wall=lambda: wall, this_boot=lambda: this_boot)


def unreadable_count(kind: str) -> float:
    """The ``worker_detached_unreadable_files_total`` series of ``kind``."""
    value = REGISTRY.get_sample_value(UNREADABLE, {"kind": kind})
    assert value is not None, f"no {UNREADABLE} series for {kind}"
    return value


def stop_worker(pid: int | None, start_time: int | None) -> None:
    """Kill a detached worker's group if that process is still the worker (test clean-up)."""
    if pid is not None and start_time is not None and process_start_time(pid) == start_time:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        wait_until(lambda: process_start_time(pid) is None)
