"""What every case of the battery shares: its verdict's parts, its setup, its tasks' envelopes.

Every case publishes its own tasks (ids ``cf-<run>-<case>-<n>``), waits for their reports on
the :class:`~async_task_api_worker.conformance.wire.Wire`, and returns the problems it found
(none: passed) and what it saw. A case that needs what the broker or the kit lacks raises
:class:`Skip` with the reason. The rules come from docs/protocol.md, each check naming its
section; the reference task from docs/conformance.md.

The cases are independent: a worker that breaks one rule fails the case of that rule alone.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from async_task_api_worker.conformance.admin import Admin
from async_task_api_worker.conformance.wire import Seen, Wire

__all__ = [
    "CATCH_WINDOW_S",
    "CLIENT_ID",
    "HOLD_S",
    "SETTLE_S",
    "SHOWN",
    "SLEEP_S",
    "Case",
    "Findings",
    "Setup",
    "Skip",
    "attempt_of",
    "capped",
    "envelope",
    "error_code",
    "kinds",
    "one_success",
    "per_attempt",
    "task_id",
    "terminal",
]

#: The client id of every envelope the kit sends.
CLIENT_ID: Final = "conformance-kit"
#: How long the kit keeps watching after a terminal report, for anything that follows it, in s.
SETTLE_S: Final = 0.5
#: How long the kit takes back what the input queue still delivers, once all should be settled.
CATCH_WINDOW_S: Final = 1.0
#: How long the output queue is held full to see that the input is still unacked, in seconds.
HOLD_S: Final = 2.0
#: How long the ``acknowledgement`` case's task sleeps, in seconds: long enough that its
#: handler returns well after ``started`` was confirmed (the hold is in place before it starts).
SLEEP_S: Final = 2.0
#: The items a verdict's line shows of a list (reports, attempts), at most: a worker that loops
#: on a task sends thousands.
SHOWN: Final = 12


class Skip(Exception):
    """The case cannot run here; the message says why."""


@dataclass(frozen=True, slots=True)
class Setup:
    """What the kit knows of the worker under test.

    Attributes:
        service: the worker's service name (the envelopes' ``service``, the reports' too).
        delivery_limit: the worker's ``WORKER_DELIVERY_LIMIT`` (attempts a task gets).
        progress_interval_s: the worker's ``WORKER_PROGRESS_MIN_INTERVAL_S``, in seconds.
        max_message_bytes: the worker's ``WORKER_MAX_MESSAGE_BYTES``: the largest body it takes.
        run_id: this run's mark in every task id.
        admin: the broker's operator tool, for the cases that need a policy; ``None``: those
            are skipped for ``admin_missing``.
        admin_missing: why there is no operator tool.
        broker_url: the worker's broker, for the cases that connect as a client of their own
            (``cancel``).
        control_exchange: the worker's ``CONTROL_EXCHANGE_NAME`` (empty: the default name).
    """

    service: str
    delivery_limit: int
    progress_interval_s: float
    max_message_bytes: int
    run_id: str
    admin: Admin | None = None
    admin_missing: str = ""
    broker_url: str = ""
    control_exchange: str = ""


@dataclass
class Findings:
    """What a case found: ``problems`` (none: it passed) and ``notes`` on what it saw.

    ``unchecked``: the checks the case could not make here, each with why; a strict run fails
    the case for them (``battery.strictly``), another notes them.
    """

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)

    def expect(self, holds: bool, problem: str) -> bool:
        """Record ``problem`` unless ``holds``; returns ``holds``."""
        if not holds:
            self.problems.append(problem)
        return holds


@dataclass(frozen=True, slots=True)
class Case:
    """A named case: what it checks (one line) and how."""

    name: str
    checks: str
    run: Callable[[Wire, Setup, Findings], Awaitable[None]]


def task_id(setup: Setup, case: str, n: int) -> str:
    """The id of task ``n`` of ``case`` in this run."""
    return f"cf-{setup.run_id}-{case}-{n}"


def envelope(setup: Setup, tid: str, task_input: Any, **fields: Any) -> bytes:
    """A compact envelope for ``task_input``; ``fields`` replace or add top-level fields."""
    document: dict[str, Any] = {
        "protocol_version": 1,
        "task_id": tid,
        "client_id": CLIENT_ID,
        "service": setup.service,
        "input": task_input,
    }
    document.update(fields)
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def capped(items: Sequence[Any], separator: str = ", ") -> str:
    """The first :data:`SHOWN` of ``items`` joined, then ``... N more`` for the rest, if any."""
    shown = separator.join(str(item) for item in items[:SHOWN])
    return shown + (f"{separator}... {len(items) - SHOWN:,} more" if len(items) > SHOWN else "")


def kinds(reports: list[Seen]) -> str:
    """The reports' types, comma-separated (``nothing`` for none), for a verdict's line.

    The first :data:`SHOWN` only, and how many more (``capped``).
    """
    return capped([str(seen.type) for seen in reports], ",") or "nothing"


def attempt_of(seen: Seen) -> Any:
    """The report's ``attempt`` by its value: an integral float (``3.0``) is read as ``3``.

    The cases judge which attempt a report is of; whether it is written as an integer is
    ``conformance.report_rules``' rule, reported once a run.
    """
    attempt = (seen.document or {}).get("attempt")
    if isinstance(attempt, float) and attempt.is_integer():
        return int(attempt)
    return attempt


def per_attempt(reports: list[Seen]) -> list[tuple[Any, str | None]]:
    """The reports' ``(attempt, type)``, progress left out and a pair repeated in a row once.

    What came at which attempt, for the cases that judge attempts: how many reports of a kind
    one delivery sends is the ``order`` case's rule.
    """
    pairs: list[tuple[Any, str | None]] = []
    for seen in reports:
        pair = (attempt_of(seen), seen.type)
        if seen.type != "progress" and pair not in pairs[-1:]:
            pairs.append(pair)
    return pairs


def terminal(reports: list[Seen]) -> Seen | None:
    """The first terminal report of ``reports``, if any."""
    return next((seen for seen in reports if seen.terminal), None)


def error_code(seen: Seen | None) -> str | None:
    """The ``error.code`` of a ``failure`` report (``None`` for anything else)."""
    error = None if seen is None or seen.document is None else seen.document.get("error")
    return error.get("code") if isinstance(error, dict) else None


def one_success(found: Findings, tid: str, reports: list[Seen], what: str) -> Seen | None:
    """Expect a ``success`` as the first terminal report of ``tid``; return that report."""
    last = terminal(reports)
    found.expect(
        last is not None and last.type == "success",
        f"{what}: expected a success report, saw {kinds(reports)}",
    )
    return last
