"""Running the battery against a worker service, and saying the verdicts.

:func:`run_battery` opens a :class:`~async_task_api_worker.conformance.wire.Wire` to the
worker's queues and runs the cases of ``conformance.cases`` one after another (a case's tasks
must not mix with another's: one of them borrows deliveries). Each ends ``pass``, ``fail`` (the
problems found) or ``skip`` (why it could not run); a strict run (:func:`strictly`) makes a
skip a failure that says so. :func:`table` and :func:`junit_xml` say them; the command exits 0
only when no case failed.
"""

from __future__ import annotations

import contextlib
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Final

from async_task_api_worker.conformance.admin import AdminError
from async_task_api_worker.conformance.cases import CASES, OPT_IN, Case, Findings, Setup, Skip
from async_task_api_worker.conformance.dead_letters import remove_leftovers
from async_task_api_worker.conformance.wire import Wire

__all__ = [
    "STRICT_SKIP",
    "STRICT_UNCHECKED",
    "Battery",
    "Outcome",
    "Verdict",
    "junit_xml",
    "new_run_id",
    "run_battery",
    "strictly",
    "table",
]

#: How a skip made a failure by ``--strict`` starts its first line.
STRICT_SKIP: Final = "skipped, a failure under --strict: "
#: How a check not made, made a failure by ``--strict``, starts its first line.
STRICT_UNCHECKED: Final = "not checked, a failure under --strict: "
#: How a check not made starts its line otherwise.
_UNCHECKED: Final = "not checked: "


class Outcome(StrEnum):
    """How a case ended."""

    PASS = "pass"  # noqa: S105 - a verdict, not a password
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One case's verdict: what it checks, how it ended, what was seen, and its time in s.

    ``strict_skip``: the case was skipped, or made a check not, and a strict run made that a
    failure. ``unchecked``: the checks not made, each with why (also among ``seen``).
    """

    case: str
    checks: str
    outcome: Outcome
    seen: tuple[str, ...]
    duration_s: float
    strict_skip: bool = False
    unchecked: tuple[str, ...] = ()


def strictly(verdict: Verdict) -> Verdict:
    """``verdict`` in a strict run: a skip, or a check not made, is a failure that says so."""
    if verdict.unchecked and verdict.outcome is not Outcome.SKIP:
        first = STRICT_UNCHECKED + "; ".join(verdict.unchecked)
        rest = tuple(line for line in verdict.seen if not line.startswith(_UNCHECKED))
        return replace(verdict, outcome=Outcome.FAIL, seen=(first, *rest), strict_skip=True)
    if verdict.outcome is not Outcome.SKIP:
        return verdict
    why = verdict.seen[0] if verdict.seen else "no reason given"
    seen = (STRICT_SKIP + why, *verdict.seen[1:])
    return replace(verdict, outcome=Outcome.FAIL, seen=seen, strict_skip=True)


@dataclass(frozen=True, slots=True)
class Battery:
    """Where the worker under test is, and what it was configured with.

    Attributes:
        url: the broker's AMQP URL (its vhost is the worker's).
        in_queue: the worker's input queue.
        out_queue: its output queue; the kit consumes it for the run.
        setup: the worker's settings as the cases need them.
        timeout_s: the longest wait for any one report, in seconds.
        only: the names of the cases to run, opt-in ones included (empty: every case that is
            not opt-in).
        opt_in: opt-in cases to run besides those (``--with``).
        strict: a skipped case fails (:func:`strictly`).
    """

    url: str
    in_queue: str
    out_queue: str
    setup: Setup
    timeout_s: float = 30.0
    only: tuple[str, ...] = ()
    opt_in: tuple[str, ...] = ()
    strict: bool = False

    def cases(self) -> tuple[Case, ...]:
        """The cases to run, in the battery's order (the opt-in ones last).

        ``only`` narrows the default cases and may name opt-in ones; ``opt_in`` adds to
        whatever ``only`` chose.

        Raises:
            ValueError: ``only`` or ``opt_in`` names a case that does not exist, or
                ``opt_in`` one that is not opt-in.
        """
        every = (*CASES, *OPT_IN)
        names = [case.name for case in every]
        unknown = [name for name in (*self.only, *self.opt_in) if name not in names]
        if unknown:
            raise ValueError(
                f"unknown case {', '.join(unknown)} (the cases: {', '.join(sorted(names))})"
            )
        optional = [case.name for case in OPT_IN]
        default = [name for name in self.opt_in if name not in optional]
        if default:
            raise ValueError(
                f"{', '.join(default)} is not an opt-in case, it runs by default (the opt-in "
                f"cases: {', '.join(optional)})"
            )
        chosen = {*(self.only or (case.name for case in CASES)), *self.opt_in}
        return tuple(case for case in every if case.name in chosen)


def new_run_id() -> str:
    """A short id marking one run's task ids (8 hex digits)."""
    return uuid.uuid4().hex[:8]


async def _run_case(case: Case, wire: Wire, setup: Setup) -> Verdict:
    started = time.monotonic()
    found = Findings()
    try:
        await case.run(wire, setup, found)
    except Skip as skip:
        return Verdict(case.name, case.checks, Outcome.SKIP, (str(skip),), _since(started))
    except Exception as exc:  # a case that cannot finish fails, and says why
        found.problems.append(f"the case stopped: {type(exc).__name__}: {exc}"[:300])
    # The rules every report keeps, whatever its case: one place, so no case can forget them.
    found.problems.extend(wire.broken_rules(setup.service))
    outcome = Outcome.FAIL if found.problems else Outcome.PASS
    unchecked = tuple(found.unchecked)
    seen = (*found.problems, *found.notes, *(_UNCHECKED + why for why in unchecked))
    return Verdict(case.name, case.checks, outcome, seen, _since(started), unchecked=unchecked)


def _since(started: float) -> float:
    return round(time.monotonic() - started, 2)


async def run_battery(battery: Battery) -> list[Verdict]:
    """Run the cases against the worker, in order.

    A worker that does not answer the first case (``round_trip``) fails it, and the cases
    after it are skipped rather than timed out one by one; so are the cases after the worker
    stopped consuming or the broker connection was lost. In a strict run, every skip is a
    failure (:func:`strictly`).

    Raises:
        ConnectionError: the broker cannot be reached.
        LookupError: a queue is missing, or no worker consumes the input queue (within the
            timeout).
        ValueError: ``only`` names an unknown case.
    """
    cases = battery.cases()
    admin = battery.setup.admin
    if admin is not None:
        # A run killed while it held the output queue full left its policy behind: every
        # report would be refused until it is gone.
        with contextlib.suppress(AdminError):
            await admin.release()
    wire = await Wire.open(battery.url, battery.in_queue, battery.out_queue, battery.timeout_s)
    verdicts: list[Verdict] = []
    async with wire:
        await remove_leftovers(wire)
        why: str | None = None
        for case in cases:
            why = why or await wire.worker_gone()
            if why is not None:
                verdict = Verdict(case.name, case.checks, Outcome.SKIP, (why,), 0.0)
            else:
                verdict = await _run_case(case, wire, battery.setup)
            verdicts.append(strictly(verdict) if battery.strict else verdict)
            if case.name == "round_trip" and any(
                line.startswith("no report") for line in verdict.seen
            ):
                why = "the worker did not answer the round trip"
    return verdicts


def table(verdicts: Sequence[Verdict]) -> str:
    """The verdicts as a Markdown table: case, verdict, time, what was seen."""
    lines = ["| case | verdict | s | what was seen |", "|---|---|---:|---|"]
    for verdict in verdicts:
        seen = "; ".join(verdict.seen).replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {verdict.case} | {verdict.outcome.value.upper()} | {verdict.duration_s:.1f} "
            f"| {seen} |"
        )
    passed = sum(verdict.outcome is Outcome.PASS for verdict in verdicts)
    failed = sum(verdict.outcome is Outcome.FAIL for verdict in verdicts)
    strict = sum(verdict.strict_skip for verdict in verdicts)
    skipped = len(verdicts) - passed - failed
    lines.append("")
    why = f" ({strict} of them skipped or not checked, failed by --strict)" if strict else ""
    lines.append(f"{passed} passed, {failed} failed{why}, {skipped} skipped")
    return "\n".join(lines)


def junit_xml(verdicts: Sequence[Verdict], *, suite: str = "conformance") -> bytes:
    """The verdicts as JUnit XML (one ``testsuite``, a ``testcase`` per case)."""
    root = ET.Element(
        "testsuite",
        name=suite,
        tests=str(len(verdicts)),
        failures=str(sum(v.outcome is Outcome.FAIL for v in verdicts)),
        skipped=str(sum(v.outcome is Outcome.SKIP for v in verdicts)),
        time=f"{sum(v.duration_s for v in verdicts):.2f}",
    )
    for verdict in verdicts:
        element = ET.SubElement(
            root, "testcase", classname=suite, name=verdict.case, time=f"{verdict.duration_s:.2f}"
        )
        text = "\n".join(verdict.seen)
        if verdict.outcome is Outcome.FAIL:
            failure = ET.SubElement(element, "failure", message=verdict.seen[0][:200])
            failure.text = text
            if verdict.strict_skip:
                failure.set("type", "skipped under --strict")
        elif verdict.outcome is Outcome.SKIP:
            ET.SubElement(element, "skipped", message=text[:200])
        else:
            ET.SubElement(element, "system-out").text = text
    return bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True))
