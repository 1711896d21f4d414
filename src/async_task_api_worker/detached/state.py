"""The state directory of detached workers: in-flight markers and result files.

Seed 002, "State-file result + in-flight marker". Per correlation id ``C``:

- ``C.running``: the in-flight marker (JSON): who runs the work (pid, the process's start time
  and the boot id, so that a reused pid is not taken for a live worker), since when and until
  when (UTC, with offset), and the caller's ``meta`` (what it needs to report the outcome);
- ``C.input``: the message, for the worker to read (mode 0600);
- ``C.json``: the result (JSON), success or failure, written by the worker when done.

Every file is written to a temporary file in the same directory, flushed to disk and renamed
into place: a reader never sees a torn file. A file that cannot be read anyway (a disk that lied,
a hand edit) is moved to ``bad/`` with a log line, never crashing a sweep.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

__all__ = [
    "CLAIMED",
    "INPUT_SUFFIX",
    "MARKER_SUFFIX",
    "RESULT_SUFFIX",
    "Marker",
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


def move_aside(path: Path, why: str) -> None:
    """Move an unreadable state file to ``bad/`` (kept for a human), with a log line."""
    bad = path.parent / BAD_DIR
    bad.mkdir(exist_ok=True)
    target = bad / f"{path.name}.{uuid.uuid4().hex[:8]}"
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, target)
        _logger.error("Unreadable state file %s (%s): moved to %s", path.name, why, target)


def boot_id() -> str:
    """This boot's id (Linux's ``/proc/sys/kernel/random/boot_id``), or ``""``."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


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


@dataclass
class Marker:
    """An in-flight marker.

    Attributes:
        correlation_id: the work's id (the task id for the ``tick`` command).
        deadline_at: when the work must be done (UTC, ISO 8601 with offset).
        started_at: when it was handed out (UTC, ISO 8601 with offset).
        pid: the detached worker's pid, ``None`` until it is spawned.
        start_time: the worker's start time in clock ticks since boot.
        boot_id: the boot the worker started in.
        meta: the caller's data about the work, given back with its outcome.
    """

    correlation_id: str
    deadline_at: str
    started_at: str = field(default_factory=lambda: _utc(time.time()))
    pid: int | None = None
    start_time: int | None = None
    boot_id: str = field(default_factory=boot_id)
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def new(cls, correlation_id: str, deadline_s: float, meta: dict[str, Any]) -> Marker:
        """A marker for work that must end within ``deadline_s`` seconds from now."""
        return cls(correlation_id, _utc(time.time() + deadline_s), meta=dict(meta))

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Marker:
        """Read a marker back.

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
            )
            if datetime.fromisoformat(marker.deadline_at).tzinfo is None:
                raise ValueError("a deadline without its UTC offset")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a marker ({type(exc).__name__})") from exc
        return marker

    def to_json(self) -> bytes:
        """The marker as JSON bytes."""
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @property
    def past_deadline(self) -> bool:
        """Whether the deadline has passed."""
        return datetime.now(UTC) > datetime.fromisoformat(self.deadline_at)

    def worker_alive(self) -> bool:
        """Whether the worker it names still runs: same pid, same start time, same boot."""
        if self.pid is None or self.start_time is None:
            return False
        if self.boot_id and self.boot_id != boot_id():
            return False
        return process_start_time(self.pid) == self.start_time
