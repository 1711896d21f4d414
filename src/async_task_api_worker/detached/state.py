"""The state directory of detached workers: in-flight markers, results, reports sent.

Seed 002, "State-file result + in-flight marker". Per correlation id ``C``:

- ``C.running``: the in-flight marker (JSON): who runs the work (pid, the process's start time
  and the boot id, so that a reused pid is not taken for a live worker), since when and for how
  long, and the caller's ``meta`` (what it needs to report the outcome);
- ``C.input``: the message, for the worker to read (mode 0600);
- ``C.json``: the result (JSON), success or failure, written by the worker when done;
- ``C.done``: left by a sweep once it sent the task's outcome: a later outcome (a worker that
  finished after its expiry) is dropped, never sent as a second, contradicting one.

The marker and its clocks are :mod:`.marker`'s; :class:`Clocks` bundles the clocks the state is
read with, so that tests inject their own.

**The hand-out** (:func:`~async_task_api_worker.detached.spawn.spawn_detached`) commits with one
atomic write, the marker's: before it, the work is not handed out (the message, staged under a
temporary name, is not in place yet); from it on, it is, with what a sweep needs to conclude it.
:func:`handed_out` is that one test. Its input is put in place right after the marker.

Every file is written to a temporary file in the same directory, flushed to disk and renamed
into place: a reader never sees a torn file. Temporary and claimed files carry the identity of
the process that made them (:mod:`.claims`): what a killed process left is cleaned, or taken
over, by the next sweep. A file that cannot be read anyway (a disk that lied, a hand edit) is
moved to ``bad/`` with an ERROR line, never crashing a sweep.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from async_task_api_worker.detached.claims import CLAIMED, boot_id, temporary_for

__all__ = [
    "DONE_RETENTION_S",
    "DONE_SUFFIX",
    "INPUT_SUFFIX",
    "MARKER_SUFFIX",
    "RESULT_SUFFIX",
    "SYSTEM_CLOCKS",
    "Clocks",
    "aside_for",
    "boot_clock",
    "handed_out",
    "out_beside",
    "move_aside",
    "place",
    "read_json",
    "stage",
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


def stage(path: Path, data: bytes, *, mode: int = 0o600) -> Path:
    """Write ``data`` to a temporary file beside ``path``, flushed to disk; return its path.

    The name is :func:`.claims.temporary_for`'s: a sweep removes it once this process is dead.

    Raises:
        OSError: it could not be written (nothing is left behind).
    """
    temporary = temporary_for(path)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    finally:
        os.close(fd)
    return temporary


def place(staged: Path, path: Path, *, exclusive: bool = False) -> None:
    """Rename a :func:`stage`-d file over ``path``; ``fsync`` the directory (the rename lasts).

    With ``exclusive``, ``path`` must not exist: the file is linked in place (one atomic step
    that fails when the name is taken), then its staged name removed.

    Raises:
        FileExistsError: ``exclusive`` and ``path`` exists (the staged file is removed).
        OSError: the rename failed (the staged file is removed).
    """
    try:
        if exclusive:
            os.link(staged, path)
            os.unlink(staged)
        else:
            os.replace(staged, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_atomically(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one.

    :func:`stage`, then :func:`place`: a temporary file in the same directory, written, flushed
    and ``fsync``-ed, renamed over ``path``, and the directory ``fsync``-ed.

    Raises:
        OSError: the file could not be written.
    """
    place(stage(path, data, mode=mode), path)


def handed_out(state_dir: Path, correlation_id: str) -> bool:
    """Whether the work of ``correlation_id`` was handed out (seed 002's durable receipt).

    Its marker, its result (either one claimed, by a worker or a sweep at work on it) or its
    ``.done``: then a sweep concludes it (or did). Its input alone is not, nor a temporary
    file: the marker's write is the hand-out's commit, and the input is put in place after it.
    """
    return (state_dir / f"{correlation_id}{MARKER_SUFFIX}").exists() or out_beside(
        state_dir, correlation_id, reported=True
    )


def out_beside(state_dir: Path, correlation_id: str, *, reported: bool) -> bool:
    """Whether the work is out other than by an unclaimed marker (a hand-out just committed).

    Its marker claimed by its worker (finishing), its result (claimed or not), and with
    ``reported`` its ``.done``: each says another hand-out's work is, or was, out.
    """
    for suffix in (MARKER_SUFFIX, RESULT_SUFFIX, DONE_SUFFIX):
        name = f"{correlation_id}{suffix}"
        if suffix == DONE_SUFFIX and not reported:
            continue
        # The exact name, or its claimed form: an id may hold dots, and "t.json*" would also
        # match the files of a task "t.json-b".
        exact = suffix != MARKER_SUFFIX and (state_dir / name).exists()
        if exact or any(state_dir.glob(f"{glob.escape(name)}{CLAIMED}*")):
            return True
    return False


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


def aside_for(path: Path) -> Path:
    """Where :func:`move_aside` puts ``path``: ``bad/<name>.<hex>`` (its claim left off)."""
    name = path.name.split(CLAIMED, 1)[0]
    return path.parent / BAD_DIR / f"{name}.{uuid.uuid4().hex[:8]}"


def move_aside(
    path: Path, why: str, *, what: str = "Unreadable state file", to: Path | None = None
) -> Path | None:
    """Move a state file to ``bad/`` (kept for a human), with an ERROR line ``what name (why)``.

    ``to``: where (an :func:`aside_for` name chosen before); by default a fresh one.

    Returns:
        Where it went, or ``None`` if it was gone already (another sweep took it).
    """
    target = aside_for(path) if to is None else to
    target.parent.mkdir(exist_ok=True)
    try:
        os.replace(path, target)
    except FileNotFoundError:
        return None
    _logger.error("%s %s (%s): moved to %s", what, path.name.split(CLAIMED, 1)[0], why, target)
    return target


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
        this_boot: this boot's id (:func:`.claims.boot_id`); ``""`` where unknown.
    """

    boot: Callable[[], float] = boot_clock
    wall: Callable[[], float] = time.time
    this_boot: Callable[[], str] = boot_id


#: The system's clocks.
SYSTEM_CLOCKS: Final = Clocks()
