"""The in-flight marker of a detached worker (seed 002, "State-file result + in-flight marker").

``<id>.running`` (JSON): who runs the work (pid, the process's start time and the boot id, so
that a reused pid is not taken for a live worker), since when and for how long, and the
caller's ``meta`` (what it needs to report the outcome). Its write is the hand-out's commit
(:func:`~.state.handed_out`).

**Clocks.** A marker's time is read on the *boot clock* (:func:`~.state.boot_clock`: Linux's
``CLOCK_BOOTTIME``, which counts a suspend and is never stepped): ``started_boot_s`` is the
boot clock at the hand-out, ``deadline_s`` a duration. On the boot the marker names, the
deadline has passed when ``boot_clock() - started_boot_s >= deadline_s``, so a step of the wall
clock (NTP, a hand-set date) neither shortens nor lengthens a task's time; on another boot the
worker cannot be alive. ``started_at`` and ``deadline_at`` (UTC, with offset) stay in the file
for people, and are the rule only for a marker without the boot fields (written before them).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from async_task_api_worker.detached.claims import Process, boot_id
from async_task_api_worker.detached.state import SYSTEM_CLOCKS, Clocks

__all__ = ["Marker"]


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
        return Process(self.pid, self.start_time, self.boot_id).running(clocks.this_boot())
