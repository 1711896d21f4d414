"""Files named for the process that made them: claimed files and temporary files (issue 30).

A sweep (or a worker) **claims** a state file by renaming it to ``<name>#claimed-<maker>.<hex>``,
and every file is first written to a **temporary** file ``.<name>.<maker>.<hex>.tmp`` beside it.
``<maker>`` is the identity of the process that did it: ``<pid>-<start time>-<boot id>``, the
pid's start time in clock ticks since boot (``/proc/PID/stat``) and the boot id
(``/proc/sys/kernel/random/boot_id``), so that a reused pid is never taken for it.

A claimed or temporary file is **abandoned** once its maker is known dead (another boot, or no
process of that pid with that start time): a later sweep then takes the claim over, or removes
the temporary file, at once. A name that carries no identity it can read (written before
issue 30, or where ``/proc`` cannot be read) is abandoned only ``STALE_CLAIM_S`` after its last
write. Identities are read on this machine, in this pid namespace: the processes that share a
state directory must run on one machine and see each other's pids (as a marker's pid already
assumes).
"""

from __future__ import annotations

import functools
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "CLAIMED",
    "STALE_CLAIM_S",
    "Process",
    "abandoned",
    "boot_id",
    "claim",
    "claimed_name",
    "maker_of",
    "process_start_time",
    "temporary_for",
]

# "#" is in no correlation id (the protocol's id rule), so a claimed name parses back.
CLAIMED: Final = "#claimed-"
#: Seconds after its last write that a claimed or temporary file whose name carries no
#: readable identity is taken for abandoned (a sweep killed between its send and its delete).
STALE_CLAIM_S: Final = 300.0
_TEMPORARY: Final = ".tmp"
_UNKNOWN: Final = "unknown"


def boot_id() -> str:
    """This boot's id (Linux's ``/proc/sys/kernel/random/boot_id``), or ``""``."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat``), or ``None``.

    With the boot id, it tells a live process from another process that got the same pid.
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


@dataclass(frozen=True)
class Process:
    """A process, named so that a reused pid is not taken for it.

    Attributes:
        pid: its pid.
        start_time: its start time in clock ticks since boot (:func:`process_start_time`).
        boot_id: the boot it ran in (:func:`boot_id`); ``""`` where unknown.
    """

    pid: int
    start_time: int
    boot_id: str

    @classmethod
    def this(cls) -> Process | None:
        """This process, or ``None`` where its start time cannot be read (no ``/proc``)."""
        return _this(os.getpid())

    def running(self, this_boot: str) -> bool:
        """Whether it still runs: this boot (where it names one), its pid with its start time."""
        if self.boot_id and self.boot_id != this_boot:
            return False
        return process_start_time(self.pid) == self.start_time

    def tag(self) -> str:
        """Its identity as it goes into a file name: ``<pid>-<start time>-<boot id>``."""
        return f"{self.pid}-{self.start_time}-{self.boot_id or _UNKNOWN}"

    @classmethod
    def from_tag(cls, tag: str) -> Process | None:
        """The process a :meth:`tag` names, or ``None`` if ``tag`` is not one."""
        pid, _, rest = tag.partition("-")
        start_time, _, boot = rest.partition("-")
        if not (pid.isdigit() and start_time.isdigit() and boot):
            return None
        return cls(int(pid), int(start_time), "" if boot == _UNKNOWN else boot)


@functools.cache
def _this(pid: int) -> Process | None:
    # Keyed by pid: a forked child (the detached worker) gets its own identity.
    start_time = process_start_time(pid)
    return None if start_time is None else Process(pid, start_time, boot_id())


def _maker_tag() -> str:
    this = Process.this()
    return _UNKNOWN if this is None else this.tag()


def claimed_name(path: Path) -> Path:
    """A fresh name of ``path`` claimed by this process (``path`` may be claimed already)."""
    name = path.name.split(CLAIMED, 1)[0]
    return path.with_name(f"{name}{CLAIMED}{_maker_tag()}.{uuid.uuid4().hex[:8]}")


def claim(path: Path) -> Path | None:
    """Take ``path`` for this process by renaming it (atomic): ``None`` if someone was faster.

    ``path`` may be a claimed file already (an abandoned claim, taken over).
    """
    claimed = claimed_name(path)
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return None
    return claimed


def temporary_for(path: Path) -> Path:
    """A fresh temporary name beside ``path``, for this process to write before its rename.

    Its claim is left off ``path``'s name: a claimed name is long already.
    """
    name = path.name.split(CLAIMED, 1)[0]
    return path.with_name(f".{name}.{_maker_tag()}.{uuid.uuid4().hex[:8]}{_TEMPORARY}")


def maker_of(path: Path) -> Process | None:
    """The process a claimed or temporary file's name names, or ``None`` (none, or unreadable)."""
    name = path.name
    if CLAIMED in name:
        tag, _, _ = name.split(CLAIMED, 1)[1].rpartition(".")
    elif name.startswith(".") and name.endswith(_TEMPORARY):
        parts = name[1 : -len(_TEMPORARY)].rsplit(".", 2)
        tag = parts[1] if len(parts) == 3 else ""
    else:
        return None
    return Process.from_tag(tag)


def abandoned(path: Path, *, this_boot: str, now_s: float) -> bool:
    """Whether a claimed or temporary file was left by a process that died before it was done.

    Args:
        path: the file.
        this_boot: this boot's id (``""`` where unknown).
        now_s: the wall clock, seconds since the epoch (for a name without an identity).

    Returns:
        Its maker known dead; for a name without a readable identity, its last write more than
        ``STALE_CLAIM_S`` ago. ``False`` if it is gone.
    """
    maker = maker_of(path)
    if maker is not None:
        return not maker.running(this_boot)
    try:
        return now_s - path.stat().st_mtime > STALE_CLAIM_S
    except OSError:  # another sweep took it meanwhile
        return False
