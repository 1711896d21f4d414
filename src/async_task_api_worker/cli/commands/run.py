"""``run my_module:worker``: the worker on RabbitMQ, until SIGTERM or SIGINT."""

from __future__ import annotations

from async_task_api_worker.cli.loading import load_worker
from async_task_api_worker.runtime.entry import run_worker

__all__ = ["run_command"]


def run_command(target: str) -> int:
    """Load the worker (exit 2 on a definition error), then run it.

    Raises:
        ConfigError: the target or its definition is wrong (the caller exits 2).
    """
    return int(run_worker(load_worker(target)))
