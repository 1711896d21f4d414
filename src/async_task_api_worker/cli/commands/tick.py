"""``tick my_module:worker --state-dir DIR --budget-s N``: one budgeted tick (docs/detached.md)."""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

from async_task_api_worker.cli.loading import load_worker
from async_task_api_worker.detached.tick import run_tick
from async_task_api_worker.errors import BrokerUnavailableError, SettingsError
from async_task_api_worker.observability.logging import configure_logging
from async_task_api_worker.runtime.entry import prepare
from async_task_api_worker.runtime.exit_codes import ExitCode

__all__ = ["tick_command"]


def tick_command(target: str, *, state_dir: str, budget_s: float, max_new: int) -> int:
    """Run one tick; 0 when done, 1 if the broker could not be used.

    Raises:
        ConfigError: the target, a setting or an argument is wrong (the caller exits 2).
    """
    if not math.isfinite(budget_s) or budget_s <= 0:
        raise SettingsError("--budget-s must be a positive number of seconds")
    if max_new < 0:
        raise SettingsError("--max-new must be 0 or more")
    worker = load_worker(target)
    settings = prepare(worker)
    configure_logging(settings.log_level)
    try:
        report = asyncio.run(
            run_tick(worker, target, settings, Path(state_dir), budget_s=budget_s, max_new=max_new)
        )
    except (BrokerUnavailableError, TimeoutError) as exc:
        print(f"async-task-api-worker: the broker could not be used ({exc})", file=sys.stderr)
        return ExitCode.FAILURE
    print(
        f"tick: {len(report.swept.delivered)} results delivered, "
        f"{len(report.swept.expired)} expired, {len(report.spawned)} started",
        file=sys.stderr,
    )
    return ExitCode.OK
