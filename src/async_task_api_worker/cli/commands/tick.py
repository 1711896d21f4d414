"""``tick my_module:worker --state-dir DIR --budget-s N``: one budgeted tick (docs/detached.md)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from async_task_api_worker.cli.loading import load_target
from async_task_api_worker.detached.state import stage
from async_task_api_worker.detached.tick import run_tick
from async_task_api_worker.errors import BrokerUnavailableError, SettingsError
from async_task_api_worker.observability.logging import configure_logging
from async_task_api_worker.observability.metrics import WorkerMetrics
from async_task_api_worker.runtime.exit_codes import ExitCode, say_error
from async_task_api_worker.settings import load_settings

__all__ = ["tick_command"]

T = TypeVar("T")


def _check_writable(state_dir: Path) -> None:
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        # A temporary file named for this process: a sweep removes it if the tick is killed here.
        stage(state_dir / "probe", b"").unlink()
    except OSError as exc:
        raise SettingsError(
            f"--state-dir {state_dir}: cannot write there ({exc.strerror or type(exc).__name__})"
        ) from exc


def _run_bounded(work: Coroutine[Any, Any, T], limit_s: float) -> T:
    """Run ``work`` within ``limit_s``: the tick's budget is a hard bound.

    What the work leaves running (a client library's reconnect loop) is cancelled and
    abandoned, never waited for.
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(work, timeout=limit_s))
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.sleep(0.05))
        loop.close()


def tick_command(
    target: str,
    *,
    state_dir: str,
    budget_s: float,
    max_new: int,
    flags: Mapping[str, str] | None = None,
) -> int:
    """Run one tick; 0 when done, 1 if the broker could not be used or did not take everything.

    ``flags`` are the setting flags' values by field name; they win over the environment.

    Raises:
        ConfigError: the target, a setting or an argument is wrong (the caller exits 2).
    """
    if not math.isfinite(budget_s) or budget_s <= 0:
        raise SettingsError("--budget-s must be a positive number of seconds")
    if max_new < 0:
        raise SettingsError("--max-new must be 0 or more")
    settings = load_settings(flags)
    worker = load_target(target, settings)
    _check_writable(Path(state_dir))
    configure_logging(settings.log_level, log_format=settings.log_format)
    tick = run_tick(
        worker,
        target,
        settings,
        Path(state_dir),
        budget_s=budget_s,
        max_new=max_new,
        observers=(WorkerMetrics(),),  # the same events move the same metrics as in ``run``
    )
    try:
        report = _run_bounded(tick, budget_s)
    except TimeoutError:
        say_error(f"the tick ran out of its {budget_s:g} s")
        return ExitCode.FAILURE
    except BrokerUnavailableError as exc:
        say_error(f"the broker could not be used ({exc})")
        return ExitCode.FAILURE
    print(
        f"tick: {len(report.swept.delivered)} results delivered, "
        f"{len(report.swept.expired)} expired, {len(report.spawned)} started, "
        f"{len(report.concluded)} concluded at once",
        file=sys.stderr,
    )
    if not report.ok:
        print(
            f"async-task-api-worker: the tick could not report or settle "
            f"{len(report.problems)} task(s); a later tick tries again",
            file=sys.stderr,
        )
        return ExitCode.FAILURE
    return ExitCode.OK
