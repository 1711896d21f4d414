"""A detached task's result file, and the failures a sweep makes when its worker left none.

A result file is the one conclusion JSON (``conclusion.conclusion_to_json``) with the
correlation id and the task's ``meta``, whoever writes it: the worker or a sweep (seed 002,
"Per-tick sweep"). A worker still running at its deadline is ``TASK_TIMEOUT`` in the task
call's words (``task_call.task_timeout``). The sweep that first sends a result adds its
report's timestamp (``REPORT_TIMESTAMP``): sent again, the report is the same bytes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from async_task_api_worker.conclusion import (
    Conclusion,
    Failure,
    conclusion_from_json,
    conclusion_to_json,
)
from async_task_api_worker.detached.marker import Marker
from async_task_api_worker.detached.state import INPUT_SUFFIX, Clocks, read_json
from async_task_api_worker.protocol.codes import ErrorCode
from async_task_api_worker.protocol.reports import format_timestamp
from async_task_api_worker.task_call import task_timeout

__all__ = [
    "DETACHED_CODES",
    "RECOVERED_META",
    "REPORT_TIMESTAMP",
    "detached_conclusion",
    "expiry",
    "recovered_meta",
    "report_made_at",
    "result_file",
    "stamp_report",
]

#: The fields of ``<id>.input``'s ``context`` (``tick``'s) recovered as a lost marker's meta.
RECOVERED_META: Final = ("task_id", "client_id", "attempt", "delivery_limit")


def recovered_meta(state_dir: Path, correlation_id: str) -> dict[str, Any]:
    """The task's ``meta`` from ``<id>.input``'s ``context`` (``tick`` writes it), or ``{}``."""
    try:
        context = read_json(state_dir / f"{correlation_id}{INPUT_SUFFIX}").get("context")
    except (OSError, ValueError):
        return {}
    if not isinstance(context, dict):
        return {}
    return {key: context[key] for key in RECOVERED_META if key in context}


#: The key of a result file that holds its report's timestamp (the protocol's form, UTC).
REPORT_TIMESTAMP: Final = "report_timestamp"


def stamp_report(result: dict[str, Any], wall_s: float) -> bool:
    """Give ``result`` its report's timestamp unless it has one; whether it was given one.

    ``wall_s``: the wall clock, seconds since the epoch.
    """
    if REPORT_TIMESTAMP in result:
        return False
    result[REPORT_TIMESTAMP] = format_timestamp(datetime.fromtimestamp(wall_s, UTC))
    return True


def report_made_at(result: dict[str, Any]) -> datetime | None:
    """The report timestamp ``result`` holds, or ``None`` (none, or not a UTC time)."""
    value = result.get(REPORT_TIMESTAMP)
    try:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return moment if moment is not None and moment.tzinfo is not None else None


def result_file(
    correlation_id: str, conclusion: Conclusion, meta: dict[str, Any]
) -> dict[str, Any]:
    """A result file's JSON: the one conclusion JSON, with the correlation id and the ``meta``."""
    return {**conclusion_to_json(conclusion), "correlation_id": correlation_id, "meta": meta}


def expiry(marker: Marker, alive: bool, clocks: Clocks) -> Failure:
    """A marker past its deadline: ``TASK_TIMEOUT`` if its worker is alive, else ``WORKER_DIED``."""
    if alive:  # killed at its deadline, as every face ends a task past it
        return task_timeout(marker.duration_s)
    deadline = marker.deadline_at
    if marker.from_another_boot(clocks):
        why = "the machine restarted before the detached worker left a result"
    elif marker.recovered_from is not None:
        bad = f"bad/{marker.recovered_from}"
        why = f"the detached worker's marker could not be read (kept as {bad}), no result came"
    else:
        why = f"the detached worker died without a result (deadline {deadline})"
    return Failure(ErrorCode.WORKER_DIED, why)


#: The SDK's own codes a detached result may carry: the task call's in the worker, its
#: watchdog's ``TASK_TIMEOUT``, and the sweep's expiries.
DETACHED_CODES: Final = frozenset(
    {
        ErrorCode.INTERNAL_ERROR,
        ErrorCode.INVALID_RESULT,
        ErrorCode.TASK_TIMEOUT,
        ErrorCode.WORKER_DIED,
    }
)


def detached_conclusion(result: dict[str, Any]) -> Conclusion:
    """The conclusion of a detached worker's result file (the one conclusion JSON).

    Only the codes a detached worker, its watchdog and the sweep may give are the SDK's own
    (``DETACHED_CODES``): another reserved code is the result's own error, and a result that
    is not a conclusion is ``INVALID_RESULT``.
    """
    try:
        return conclusion_from_json(result, sdk_codes=DETACHED_CODES)
    except ValueError as exc:
        return Failure(ErrorCode.INVALID_RESULT, f"the detached worker's result is invalid: {exc}")
