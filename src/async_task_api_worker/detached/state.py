"""The state directory of detached workers: in-flight markers, results, reports sent.

Seed 002, "State-file result + in-flight marker". Per correlation id ``C``:

- ``C.running``: the in-flight marker (JSON): who runs the work (pid, the process's start time
  and the boot id, so that a reused pid is not taken for a live worker), since when and for how
  long, and the caller's ``meta`` (what it needs to report the outcome);
- ``C.input``: the message, for the worker to read (mode 0600);
- ``C.json``: the result (JSON), success or failure, written by the worker when done;
- ``C.done``: left by a sweep once it sent the task's outcome: a later outcome (a worker that
  finished after its expiry) is dropped, never sent as a second, contradicting one.

**Clocks.** A marker's time is read on the *boot clock* (:func:`boot_clock`: Linux's
``CLOCK_BOOTTIME``, which counts a suspend and is never stepped): ``started_boot_s`` is the
boot clock at the hand-out, ``deadline_s`` a duration. On the boot the marker names, the
deadline has passed when ``boot_clock() - started_boot_s >= deadline_s``, so a step of the wall
clock (NTP, a hand-set date) neither shortens nor lengthens a task's time; on another boot the
worker cannot be alive. ``started_at`` and ``deadline_at`` (UTC, with offset) stay in the file
for people, and are the rule only for a marker without the boot fields (written before them).
:class:`Clocks` bundles the clocks, so that tests inject their own.

Every file is written to a temporary file in the same directory, flushed to disk and renamed
into place: a reader never sees a torn file. A file that cannot be read anyway (a disk that lied,
a hand edit) is moved to ``bad/`` with an ERROR line, never crashing a sweep.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

__all__ = [
    "CLAIMED",
    "DONE_RETENTION_S",
    "DONE_SUFFIX",
    "INPUT_SUFFIX",
    "MARKER_SUFFIX",
    "RESULT_SUFFIX",
    "SYSTEM_CLOCKS",
    "Clocks",
    "Marker",
    "boot_clock",
    "boot_id",
    "claim",
    "move_aside",
    "process_start_time",
    "read_json",
    "write_atomically",
]

_logger = logging.getLogger("async_task_api_worker.detached")

MARKER_SUFFIX: Final = ".running"
RESULT_SUFFIX: Final = ".json"
INPUT_SUFFIX: Final = ".input"
#: Left by a sweep once a task's outcome was sent (and by ``tick`` once it was published).
DONE_SUFFIX: Final = ".done"
#: Seconds a ``.done`` file is kept: a later outcome, or a redelivery of the task's input (a
#: tick killed before its ack), is recognised for this long.
DONE_RETENTION_S: Final = 7 * 24 * 3600.0
BAD_DIR: Final = "bad"


def write_atomically(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one.

    A temporary file in the same directory, written, flushed and ``fsync``-ed, then renamed
    over ``path``; the directory is ``fsync``-ed too, so the rename survives a crash.

    Raises:
        OSError: the file could not be written.
    """
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``.

    Raises:
        FileNotFoundError: it is gone (another sweep took it).
        ValueError: it is not a JSON object.
    """
    document = json.loads(path.read_bytes())
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    return document


# "#" is in no correlation id (the protocol's id rule), so a claimed name parses back.
CLAIMED: Final = "#claimed-"


def claim(path: Path) -> Path | None:
    """Take ``path`` for oneself by renaming it (atomic): ``None`` if someone was faster."""
    name = path.name.split(CLAIMED, 1)[0]
    claimed = path.with_name(f"{name}{CLAIMED}{uuid.uuid4().hex}")
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return None
    return claimed


def move_aside(path: Path, why: str, *, what: str = "Unreadable state file") -> Path | None:
    """Move a state file to ``bad/`` (kept for a human), with an ERROR line ``what name (why)``.

    Returns:
        Where it went, or ``None`` if it was gone already (another sweep took it).
    """
    name = path.name.split(CLAIMED, 1)[0]
    bad = path.parent / BAD_DIR
    bad.mkdir(exist_ok=True)
    target = bad / f"{name}.{uuid.uuid4().hex[:8]}"
    try:
        os.replace(path, target)
    except FileNotFoundError:
        return None
    _logger.error("%s %s (%s): moved to %s", what, name, why, target)
    return target


def boot_id() -> str:
    """This boot's id (Linux's ``/proc/sys/kernel/random/boot_id``), or ``""``."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def boot_clock() -> float:
    """Seconds on this boot's clock: ``CLOCK_BOOTTIME`` (Linux), else ``time.monotonic()``.

    Never stepped, counts a suspend (on Linux), comparable between processes of one boot.
    """
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):  # not Linux
        return time.monotonic()


@dataclass(frozen=True)
class Clocks:
    """The clocks the detached state is read with (tests inject their own).

    Attributes:
        boot: the boot clock (:func:`boot_clock`), seconds: decides every deadline.
        wall: the wall clock (``time.time``), seconds since the epoch: the times written for
            people, the rule of markers written before the boot fields, and file ages.
        this_boot: this boot's id (:func:`boot_id`); ``""`` where unknown.
    """

    boot: Callable[[], float] = boot_clock
    wall: Callable[[], float] = time.time
    this_boot: Callable[[], str] = boot_id


#: The system's clocks.
SYSTEM_CLOCKS: Final = Clocks()


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat``), or ``None``.

    With the boot id, it tells a live worker from another process that got the same pid.
    ``None`` too for a process that has exited but not been reaped (a zombie).
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[19])  # field 22 of the file, the 20th after the name
    except (IndexError, ValueError):
        return None


def _utc(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="milliseconds")


def _seconds(document: dict[str, Any], key: str) -> float | None:
    value = document.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} is not a number of seconds")
    return float(value)


@dataclass
class Marker:
    """An in-flight marker.

    Attributes:
        correlation_id: the work's id (the task id for the ``tick`` command).
        deadline_at: when the work must be done, on the wall clock (UTC, ISO 8601 with offset):
            for people, and the rule only for a marker without ``deadline_s``.
        started_at: when it was handed out, on the wall clock (UTC, ISO 8601 with offset).
        pid: the detached worker's pid, ``None`` until it is spawned.
        start_time: the worker's start time in clock ticks since boot.
        boot_id: the boot the work was handed out in.
        meta: the caller's data about the work, given back with its outcome.
        started_boot_s: when it was handed out, on the boot clock of ``boot_id``.
        deadline_s: the seconds the work may take from ``started_boot_s``.
        recovered_from: for a marker a sweep wrote in place of an unreadable one, the name of
            that file in ``bad/``.
    """

    correlation_id: str
    deadline_at: str
    started_at: str = field(default_factory=lambda: _utc(time.time()))
    pid: int | None = None
    start_time: int | None = None
    boot_id: str = field(default_factory=boot_id)
    meta: dict[str, Any] = field(default_factory=dict)
    started_boot_s: float | None = None
    deadline_s: float | None = None
    recovered_from: str | None = None

    @classmethod
    def new(
        cls,
        correlation_id: str,
        deadline_s: float,
        meta: dict[str, Any],
        *,
        clocks: Clocks = SYSTEM_CLOCKS,
    ) -> Marker:
        """A marker for work that must end within ``deadline_s`` seconds from now."""
        return cls.handed_out(correlation_id, deadline_s, meta, age_s=0.0, clocks=clocks)

    @classmethod
    def handed_out(
        cls,
        correlation_id: str,
        deadline_s: float,
        meta: dict[str, Any],
        *,
        age_s: float,
        clocks: Clocks = SYSTEM_CLOCKS,
        recovered_from: str | None = None,
    ) -> Marker:
        """A marker for work handed out ``age_s`` seconds ago, with ``deadline_s`` seconds."""
        wall = clocks.wall() - age_s
        return cls(
            correlation_id,
            deadline_at=_utc(wall + deadline_s),
            started_at=_utc(wall),
            boot_id=clocks.this_boot(),
            meta=dict(meta),
            started_boot_s=clocks.boot() - age_s,
            deadline_s=float(deadline_s),
            recovered_from=recovered_from,
        )

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Marker:
        """Read a marker back (one without the boot fields too: the wall rule applies).

        Raises:
            ValueError: a field is missing or of the wrong type.
        """
        try:
            marker = cls(
                correlation_id=str(document["correlation_id"]),
                deadline_at=str(document["deadline_at"]),
                started_at=str(document["started_at"]),
                pid=None if document.get("pid") is None else int(document["pid"]),
                start_time=None
                if document.get("start_time") is None
                else int(document["start_time"]),
                boot_id=str(document.get("boot_id", "")),
                meta=dict(document.get("meta") or {}),
                started_boot_s=_seconds(document, "started_boot_s"),
                deadline_s=_seconds(document, "deadline_s"),
                recovered_from=None
                if document.get("recovered_from") is None
                else str(document["recovered_from"]),
            )
            if datetime.fromisoformat(marker.deadline_at).tzinfo is None:
                raise ValueError("a deadline without its UTC offset")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a marker ({type(exc).__name__})") from exc
        return marker

    def to_json(self) -> bytes:
        """The marker as JSON bytes."""
        return json.dumps(self.__dict__, sort_keys=True).encode()

    def from_another_boot(self, clocks: Clocks = SYSTEM_CLOCKS) -> bool:
        """Whether it was handed out in another boot (its worker cannot be alive)."""
        this_boot = clocks.this_boot()
        return bool(self.boot_id and this_boot and self.boot_id != this_boot)

    def elapsed_s(self, clocks: Clocks = SYSTEM_CLOCKS) -> float | None:
        """Seconds since the hand-out on the boot clock (negative: a start in the future).

        ``None`` if the boot clock cannot tell: a marker without the boot fields, or from
        another boot.
        """
        if self.started_boot_s is None or self.deadline_s is None:
            return None
        if self.from_another_boot(clocks):
            return None
        return clocks.boot() - self.started_boot_s

    def started_in_future(self, clocks: Clocks = SYSTEM_CLOCKS) -> bool:
        """Whether its start on this boot's clock is still to come (a hand edit, a copy)."""
        elapsed = self.elapsed_s(clocks)
        return elapsed is not None and elapsed < 0

    def is_past_deadline(self, clocks: Clocks = SYSTEM_CLOCKS) -> bool:
        """Whether the deadline has passed: on the boot clock; at once for another boot.

        A start in the future is not past its deadline (see :meth:`restarted`).
        """
        if self.from_another_boot(clocks):
            return True
        elapsed = self.elapsed_s(clocks)
        if elapsed is None or self.deadline_s is None:
            return clocks.wall() > datetime.fromisoformat(self.deadline_at).timestamp()
        return elapsed >= self.deadline_s

    @property
    def past_deadline(self) -> bool:
        """Whether the deadline has passed, on the system's clocks."""
        return self.is_past_deadline(SYSTEM_CLOCKS)

    @property
    def duration_s(self) -> float:
        """Seconds the work may take: ``deadline_s``, else ``started_at`` to ``deadline_at``."""
        if self.deadline_s is not None:
            return self.deadline_s
        ends, began = (datetime.fromisoformat(at) for at in (self.deadline_at, self.started_at))
        return max(0.0, (ends - began).total_seconds())

    def remaining_s(self, clocks: Clocks = SYSTEM_CLOCKS) -> float:
        """Seconds left before the deadline (the worker's own watchdog), at least 0.

        On the boot clock, a start in the future counting as now; on the wall clock for a
        marker the boot clock cannot tell about.
        """
        elapsed = self.elapsed_s(clocks)
        if elapsed is None or self.deadline_s is None:
            return max(0.0, datetime.fromisoformat(self.deadline_at).timestamp() - clocks.wall())
        return max(0.0, self.deadline_s - max(0.0, elapsed))

    def restarted(self, clocks: Clocks = SYSTEM_CLOCKS) -> Marker:
        """This marker handed out now (its start in the future taken as now): same duration."""
        deadline_s = 0.0 if self.deadline_s is None else self.deadline_s
        wall = clocks.wall()
        return dataclasses.replace(
            self,
            started_boot_s=clocks.boot(),
            started_at=_utc(wall),
            deadline_at=_utc(wall + deadline_s),
        )

    def worker_alive(self, clocks: Clocks = SYSTEM_CLOCKS) -> bool:
        """Whether the worker it names still runs: same pid, same start time, same boot."""
        if self.pid is None or self.start_time is None:
            return False
        if self.boot_id and self.boot_id != clocks.this_boot():
            return False
        return process_start_time(self.pid) == self.start_time
