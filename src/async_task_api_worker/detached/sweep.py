"""The per-tick sweep and the in-flight guard (seed 002, "Per-tick sweep", "In-flight guard").

``sweep`` runs at every tick, before anything else: it delivers every finished result, then
turns every marker past its deadline into exactly one explicit error result. Concurrent sweeps
of one directory are safe: each file is claimed by an atomic rename before it is used, and only
the sweep whose rename succeeded delivers it.

One outcome per id: a sweep that sent one leaves ``<id>.done``, and drops a later one with a
WARNING. A file claimed by a sweep (or a worker) that died before it was done with it is taken
over as soon as that process is known dead (:mod:`.claims`); other leftovers are removed
(:mod:`.leftovers`). Deadlines are on the boot clock (see ``state``). An unreadable file is
moved to ``bad/`` with an ERROR line and counted (``worker_detached_unreadable_files_total``),
and the task its name gives gets ``WORKER_DIED``: at once for a result; for a marker, at
``fallback_deadline_s`` after the file's last write, unless its worker's result comes first.
A result the sweep makes for an expired marker carries ``"expired": true``.

The failures a sweep makes itself, in the one conclusion JSON, come from :mod:`.outcomes`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from async_task_api_worker.conclusion import Failure
from async_task_api_worker.detached.claims import CLAIMED, claim, claimed_name
from async_task_api_worker.detached.leftovers import abandoned_claims, drop_leftovers
from async_task_api_worker.detached.marker import Marker
from async_task_api_worker.detached.outcomes import (
    expiry,
    recovered_meta,
    result_file,
    stamp_report,
)
from async_task_api_worker.detached.state import (
    DONE_RETENTION_S,
    DONE_SUFFIX,
    INPUT_SUFFIX,
    MARKER_SUFFIX,
    RESULT_SUFFIX,
    SYSTEM_CLOCKS,
    Clocks,
    aside_for,
    move_aside,
    read_json,
    write_atomically,
)
from async_task_api_worker.observability.metrics import DETACHED_UNREADABLE_FILES
from async_task_api_worker.protocol.codes import ErrorCode
from async_task_api_worker.protocol.envelope import ID_PATTERN

__all__ = ["SweepReport", "Undeliverable", "in_flight", "prune_done", "sweep"]

_logger = logging.getLogger("async_task_api_worker.detached")

SendResult = Callable[[str, dict[str, Any]], object]

_SAFE_ID: Final = re.compile(ID_PATTERN)


class Undeliverable(Exception):
    """Raised by ``send_result`` for a result it can never send: the file is moved aside."""


@dataclass
class SweepReport:
    """What one sweep did (ids; file names in ``moved_aside``; ``dropped``: later outcomes)."""

    delivered: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    moved_aside: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


@dataclass
class _Sweep:
    state_dir: Path
    send: SendResult
    clocks: Clocks
    fallback_deadline_s: float
    report: SweepReport = field(default_factory=SweepReport)


def in_flight(state_dir: Path) -> bool:
    """Whether a detached worker's marker exists: work is mid-flight (seed 002, guard)."""
    return any(Path(state_dir).glob(f"*{MARKER_SUFFIX}"))


def _name(path: Path) -> str:
    """The state file's name, its claim left off."""
    return path.name.split(CLAIMED, 1)[0]


def _correlation_id(path: Path, suffix: str) -> str:
    return _name(path)[: -len(suffix)]


def _forget(state_dir: Path, correlation_id: str) -> None:
    for suffix in (INPUT_SUFFIX, ".log"):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / f"{correlation_id}{suffix}").unlink()


def sweep(
    state_dir: Path,
    send_result: SendResult,
    *,
    fallback_deadline_s: float = 0.0,
    clocks: Clocks = SYSTEM_CLOCKS,
) -> SweepReport:
    """Deliver finished results, then expire markers past their deadline.

    A bad file is moved aside, never raised (see the module for what its task gets).

    Args:
        state_dir: the state directory.
        send_result: ``send_result(correlation_id, result)``; a file is removed only after it
            returns. If it raises, the file is put back, the sweep stops and the exception
            propagates (a later sweep sends it); if it raises :class:`Undeliverable`, the file
            is moved to ``bad/`` and the sweep goes on.
        fallback_deadline_s: the deadline of a marker that could not be read, in seconds from
            its last write: the work's timeout; 0 reports its task at once, worker or not.
        clocks: the clocks (tests inject theirs).

    Returns:
        What was delivered, expired, moved aside and dropped.

    A sweep killed between a send and its record (``<id>.done``) leaves its claim: the next
    sweep sends the same result again, its ``report_timestamp`` included. Results carry their
    correlation id, so make the receiver idempotent on it.
    """
    state_dir = Path(state_dir)
    run = _Sweep(state_dir, send_result, clocks, fallback_deadline_s)
    if not state_dir.is_dir():
        return run.report
    results = sorted(state_dir.glob(f"*{RESULT_SUFFIX}"))
    for path in results + abandoned_claims(state_dir, RESULT_SUFFIX, clocks):
        _deliver(run, path)
    markers = sorted(state_dir.glob(f"*{MARKER_SUFFIX}"))
    for path in markers + abandoned_claims(state_dir, MARKER_SUFFIX, clocks):
        _expire(run, path)
    drop_leftovers(state_dir, clocks)
    prune_done(state_dir, wall_clock=clocks.wall)
    return run.report


def prune_done(state_dir: Path, *, wall_clock: Callable[[], float] = time.time) -> list[str]:
    """Remove the ``<id>.done`` files older than ``DONE_RETENTION_S``; return their ids."""
    now = wall_clock()
    pruned = []
    for path in Path(state_dir).glob(f"*{DONE_SUFFIX}"):
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > DONE_RETENTION_S:
                path.unlink()
                pruned.append(path.name[: -len(DONE_SUFFIX)])
    return pruned


def _reported(state_dir: Path, correlation_id: str) -> bool:
    return (state_dir / f"{correlation_id}{DONE_SUFFIX}").exists()


def _mark_reported(state_dir: Path, correlation_id: str) -> None:
    try:
        write_atomically(state_dir / f"{correlation_id}{DONE_SUFFIX}", b"")
    except OSError:
        _logger.exception("Could not record that %s was reported", correlation_id)


def _drop_late(run: _Sweep, claimed: Path, correlation_id: str) -> None:
    _logger.warning("Dropped %s: a later outcome for an already reported task", _name(claimed))
    _forget(run.state_dir, correlation_id)
    claimed.unlink(missing_ok=True)
    run.report.dropped.append(correlation_id)


def _send(
    run: _Sweep, claimed: Path, original: Path, *, correlation_id: str, result: dict[str, Any]
) -> bool:
    """Send, then record it; on failure put the file back, or aside if undeliverable."""
    try:
        run.send(correlation_id, result)
    except Undeliverable as exc:
        move_aside(claimed, f"undeliverable: {exc}", what="Undeliverable result")
        run.report.moved_aside.append(original.name)
        return False
    except Exception:
        with contextlib.suppress(OSError):
            os.rename(claimed, original)
        raise
    _mark_reported(run.state_dir, correlation_id)
    return True


def _unreadable(run: _Sweep, path: Path, name: str, kind: str, why: str, *, to: Path) -> None:
    """Move an unreadable file to ``to`` in ``bad/`` (ERROR line) and count it."""
    if move_aside(path, why, what=f"Unreadable {kind}", to=to) is not None:
        run.report.moved_aside.append(name)
        DETACHED_UNREADABLE_FILES.labels(kind).inc()


def _reportable(run: _Sweep, correlation_id: str, name: str) -> bool:
    """Whether a failure can and must be reported for the task of an unreadable file."""
    if not _SAFE_ID.fullmatch(correlation_id):
        _logger.error("Unreadable %s names no task: no failure can be reported for it", name)
        return False
    return not _reported(run.state_dir, correlation_id)  # else: reported, a leftover


def _deliver(run: _Sweep, path: Path) -> None:
    claimed = claim(path)
    if claimed is None:
        return
    correlation_id = _correlation_id(path, RESULT_SUFFIX)
    original = run.state_dir / f"{correlation_id}{RESULT_SUFFIX}"
    try:
        result = read_json(claimed)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        if _replace_result(run, claimed, _name(path), correlation_id, str(exc)):
            _deliver(run, original)
        return
    if _reported(run.state_dir, correlation_id):
        _drop_late(run, claimed, correlation_id)
        return
    if stamp_report(result, run.clocks.wall()):  # made once: sent again, the same report
        try:
            write_atomically(claimed, json.dumps(result).encode())
        except OSError:
            _logger.exception("Could not record the report timestamp of %s", correlation_id)
    if not _send(run, claimed, original, correlation_id=correlation_id, result=result):
        return
    with contextlib.suppress(FileNotFoundError):
        (run.state_dir / f"{correlation_id}{MARKER_SUFFIX}").unlink()
    _forget(run.state_dir, correlation_id)
    claimed.unlink(missing_ok=True)  # last: a sweep killed before it leaves a claim, taken over
    (run.report.expired if result.get("expired") else run.report.delivered).append(correlation_id)


def _replace_result(run: _Sweep, claimed: Path, name: str, correlation_id: str, why: str) -> bool:
    """Put a ``WORKER_DIED`` failure in place of an unreadable result if needed; move it aside.

    Its outcome is lost: its task must hear something, unless it was reported already. The
    failure is written first: a sweep killed in between leaves both, never neither.
    """
    bad = aside_for(claimed)
    original = run.state_dir / f"{correlation_id}{RESULT_SUFFIX}"
    written = False
    if _reportable(run, correlation_id, name) and not original.exists():
        why_lost = f"the detached worker's result could not be read (kept as bad/{bad.name})"
        meta = recovered_meta(run.state_dir, correlation_id)
        failure = result_file(correlation_id, Failure(ErrorCode.WORKER_DIED, why_lost), meta)
        try:
            write_atomically(original, json.dumps(failure).encode())
            written = True
        except OSError:
            _logger.exception("Could not write the failure of %s", correlation_id)
    _unreadable(run, claimed, name, "result", why, to=bad)
    return written


def _replace_marker(run: _Sweep, path: Path, why: str) -> tuple[Path, Marker] | None:
    """Write a readable marker in place of an unreadable one, then move that one aside.

    Its start: the bad file's last write; its deadline: ``fallback_deadline_s`` after it; its
    meta: what ``<id>.input`` holds. Its worker, if it runs, reports before (its own deadline
    comes first); if it does not, the sweep reports ``WORKER_DIED`` at that deadline. The bad
    file is claimed meanwhile: a sweep killed in between leaves a claim, taken over.
    """
    correlation_id = _correlation_id(path, MARKER_SUFFIX)
    try:
        written_at = path.stat().st_mtime
    except FileNotFoundError:
        return None
    except OSError:
        written_at = run.clocks.wall()
    claimed = claim(path)
    if claimed is None:
        return None  # another sweep has it
    bad = aside_for(claimed)
    target = run.state_dir / f"{correlation_id}{MARKER_SUFFIX}"
    replaced = None
    # Not if another marker is there already (a replacement a killed sweep wrote).
    if _reportable(run, correlation_id, _name(path)) and not target.exists():
        marker = Marker.handed_out(
            correlation_id,
            run.fallback_deadline_s,
            recovered_meta(run.state_dir, correlation_id),
            # The file's age, from the wall clock (all there is), carried onto the boot clock.
            age_s=max(0.0, run.clocks.wall() - written_at),
            clocks=run.clocks,
            recovered_from=bad.name,
        )
        try:
            write_atomically(target, marker.to_json())
        except OSError:
            _logger.exception("Could not replace the unreadable marker of %s", correlation_id)
        else:
            replaced = target, marker
            _logger.warning(
                "Marker %s replaced: WORKER_DIED at %s unless its worker's result comes first",
                correlation_id,
                marker.deadline_at,
            )
    _unreadable(run, claimed, _name(path), "marker", why, to=bad)
    return replaced


def _restart(run: _Sweep, path: Path, marker: Marker) -> None:
    """A start in the future (a hand edit, a copied file): WARNING, and handed out now."""
    _logger.warning("Marker %s starts in the future: taken as started now", path.name)
    if not path.exists():
        return  # reported meanwhile
    try:
        write_atomically(path, marker.restarted(run.clocks).to_json())
    except OSError:
        _logger.exception("Could not rewrite the marker of %s", marker.correlation_id)


def _expire(run: _Sweep, path: Path) -> None:
    try:
        marker = Marker.from_json(read_json(path))
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        replaced = _replace_marker(run, path, str(exc))
        if replaced is None:
            return
        path, marker = replaced
    if marker.started_in_future(run.clocks):
        _restart(run, path, marker)
        return
    if not marker.is_past_deadline(run.clocks):
        return  # before its deadline, a marker means nothing yet, even if its worker died
    correlation_id = marker.correlation_id
    original = run.state_dir / f"{correlation_id}{MARKER_SUFFIX}"
    claimed = claim(path)
    if claimed is None:
        return
    if _reported(run.state_dir, correlation_id):
        _drop_late(run, claimed, correlation_id)
        return
    if (run.state_dir / f"{correlation_id}{RESULT_SUFFIX}").exists():
        # The worker finished after all: its own result goes out (now or at the next sweep).
        claimed.unlink(missing_ok=True)
        return
    alive = marker.worker_alive(run.clocks)
    if alive and marker.pid is not None:
        # Its identity checked (pid, start time, boot): the group it leads is the worker's.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(marker.pid, signal.SIGKILL)
    failure = expiry(marker, alive, run.clocks)
    _logger.warning("Marker %s expired: %s", correlation_id, failure.code)
    # "expired": the sweep made this result, not the worker (the tick's decision line says so).
    result = {**result_file(correlation_id, failure, marker.meta), "expired": True}
    # Written as a result this sweep holds before the marker goes, and sent as one: a sweep
    # killed after its send sends the same report again, never another expiry.
    held = claimed_name(run.state_dir / f"{correlation_id}{RESULT_SUFFIX}")
    try:
        write_atomically(held, json.dumps(result).encode())
    except OSError:
        _logger.exception("Could not write the expiry of %s", correlation_id)
        with contextlib.suppress(OSError):
            os.rename(claimed, original)  # for a later sweep
        return
    claimed.unlink(missing_ok=True)
    _deliver(run, held)
