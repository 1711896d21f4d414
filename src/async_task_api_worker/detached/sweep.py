"""The per-tick sweep and the in-flight guard (seed 002, "Per-tick sweep", "In-flight guard").

``sweep`` runs at every tick, before anything else: it delivers every finished result, then
turns every marker past its deadline into exactly one explicit error result. Concurrent sweeps
of one directory are safe: each file is claimed by an atomic rename before it is used, and only
the sweep whose rename succeeded delivers it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from async_task_api_worker.detached.state import (
    CLAIMED,
    INPUT_SUFFIX,
    MARKER_SUFFIX,
    RESULT_SUFFIX,
    Marker,
    claim,
    move_aside,
    read_json,
)

__all__ = ["STALE_CLAIM_S", "SweepReport", "Undeliverable", "in_flight", "sweep"]

_logger = logging.getLogger("async_task_api_worker.detached")

#: A claimed file still there after this many seconds belongs to a sweep that was killed
#: between its send and its delete: it is delivered again (a duplicate, by design).
STALE_CLAIM_S: Final = 300.0

#: The error codes of the results a sweep makes for markers past their deadline.
WORKER_DIED: Final = "WORKER_DIED"
TASK_TIMEOUT: Final = "TASK_TIMEOUT"

SendResult = Callable[[str, dict[str, Any]], object]


class Undeliverable(Exception):
    """Raised by ``send_result`` for a result it can never send: the file is moved aside."""


@dataclass
class SweepReport:
    """What one sweep did (correlation ids)."""

    delivered: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    moved_aside: list[str] = field(default_factory=list)


def in_flight(state_dir: Path) -> bool:
    """Whether a detached worker's marker exists: work is mid-flight (seed 002, guard)."""
    return any(Path(state_dir).glob(f"*{MARKER_SUFFIX}"))


def _correlation_id(path: Path, suffix: str) -> str:
    name = path.name.split(CLAIMED, 1)[0]
    return name[: -len(suffix)]


def _forget(state_dir: Path, correlation_id: str) -> None:
    for suffix in (INPUT_SUFFIX, ".log"):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / f"{correlation_id}{suffix}").unlink()


def sweep(state_dir: Path, send_result: SendResult) -> SweepReport:
    """Deliver finished results, then expire markers past their deadline.

    A bad file is moved aside, never raised.

    Args:
        state_dir: the state directory.
        send_result: ``send_result(correlation_id, result)``; a file is removed only after it
            returns. If it raises, the file is put back, the sweep stops and the exception
            propagates (a later sweep sends it); if it raises :class:`Undeliverable`, the file
            is moved to ``bad/`` and the sweep goes on.

    Returns:
        What was delivered, expired and moved aside.

    Duplicates are possible (a kill between the send and the delete): results carry their
    correlation id, so make the receiver idempotent on it.
    """
    state_dir = Path(state_dir)
    report = SweepReport()
    if not state_dir.is_dir():
        return report
    results = sorted(state_dir.glob(f"*{RESULT_SUFFIX}")) + _stale(state_dir, RESULT_SUFFIX)
    for path in results:
        _deliver(state_dir, path, send_result, report)
    markers = sorted(state_dir.glob(f"*{MARKER_SUFFIX}")) + _stale(state_dir, MARKER_SUFFIX)
    for path in markers:
        _expire(state_dir, path, send_result, report)
    _drop_stale_temporaries(state_dir)
    return report


def _older_than(path: Path, age_s: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime > age_s
    except OSError:  # another sweep took it meanwhile
        return False


def _stale(state_dir: Path, suffix: str) -> list[Path]:
    """Files claimed by a sweep (or a worker) that died before it finished with them."""
    return [
        path
        for path in sorted(state_dir.glob(f"*{suffix}{CLAIMED}*"))
        if _older_than(path, STALE_CLAIM_S)
    ]


def _drop_stale_temporaries(state_dir: Path) -> None:
    for path in state_dir.glob(".*.tmp"):  # a writer killed before its rename
        if _older_than(path, STALE_CLAIM_S):
            path.unlink(missing_ok=True)


def _send(
    claimed: Path,
    original: Path,
    send: SendResult,
    *,
    correlation_id: str,
    result: dict[str, Any],
    report: SweepReport,
) -> bool:
    """Send; on failure put the file back (a later sweep sends it), or aside if undeliverable."""
    try:
        send(correlation_id, result)
    except Undeliverable as exc:
        move_aside(claimed, f"undeliverable: {exc}")
        report.moved_aside.append(original.name)
        return False
    except Exception:
        with contextlib.suppress(OSError):
            os.rename(claimed, original)
        raise
    return True


def _deliver(state_dir: Path, path: Path, send: SendResult, report: SweepReport) -> None:
    claimed = claim(path)
    if claimed is None:
        return
    correlation_id = _correlation_id(path, RESULT_SUFFIX)
    original = state_dir / f"{correlation_id}{RESULT_SUFFIX}"
    try:
        result = read_json(claimed)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        move_aside(claimed, str(exc))
        report.moved_aside.append(path.name)
        return
    if not _send(
        claimed, original, send, correlation_id=correlation_id, result=result, report=report
    ):
        return
    claimed.unlink(missing_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (state_dir / f"{correlation_id}{MARKER_SUFFIX}").unlink()
    _forget(state_dir, correlation_id)
    report.delivered.append(correlation_id)


def _expire(state_dir: Path, path: Path, send: SendResult, report: SweepReport) -> None:
    try:
        marker = Marker.from_json(read_json(path))
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        move_aside(path, str(exc))
        report.moved_aside.append(path.name)
        return
    if not marker.past_deadline:
        return  # before its deadline, a marker means nothing yet, even if its worker died
    correlation_id = marker.correlation_id
    original = state_dir / f"{correlation_id}{MARKER_SUFFIX}"
    claimed = claim(path)
    if claimed is None:
        return
    if (state_dir / f"{correlation_id}{RESULT_SUFFIX}").exists():
        # The worker finished after all: its own result goes out (now or at the next sweep).
        claimed.unlink(missing_ok=True)
        return
    alive = marker.worker_alive()
    if alive and marker.pid is not None:
        # Its identity checked (pid, start time, boot): the group it leads is the worker's.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(marker.pid, signal.SIGKILL)
    code = TASK_TIMEOUT if alive else WORKER_DIED
    message = (
        f"the detached worker was still running at its deadline ({marker.deadline_at}) "
        "and was killed"
        if alive
        else f"the detached worker died without a result (deadline {marker.deadline_at})"
    )
    _logger.warning("Marker %s expired: %s", correlation_id, code)
    result = {
        "correlation_id": correlation_id,
        "ok": False,
        "error": {"code": code, "message": message},
        "meta": marker.meta,
    }
    if not _send(
        claimed, original, send, correlation_id=correlation_id, result=result, report=report
    ):
        return
    claimed.unlink(missing_ok=True)
    _forget(state_dir, correlation_id)
    report.expired.append(correlation_id)
