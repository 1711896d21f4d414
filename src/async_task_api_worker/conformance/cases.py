"""The battery's cases, in the order they run (docs/conformance.md, "The cases").

``CASES`` run by default; ``OPT_IN`` ones only when asked for (``--with``), after them: they
check what the protocol leaves optional. Every case publishes its own tasks, waits for their
reports and says what it found (``conformance.case``). The cases are independent: a worker
that breaks one rule fails the case of that rule alone.
"""

from __future__ import annotations

from typing import Final

from async_task_api_worker.conformance.cancel_cases import cancel
from async_task_api_worker.conformance.case import Case, Findings, Setup, Skip
from async_task_api_worker.conformance.inbound_cases import decoding, limits, round_trip
from async_task_api_worker.conformance.report_cases import encoding, order
from async_task_api_worker.conformance.settle_cases import acknowledgement, retries

__all__ = ["CASES", "OPT_IN", "Case", "Findings", "Setup", "Skip"]

CASES: Final = (
    Case("round_trip", "a task's started and success", round_trip),
    Case("decoding", "poison bodies and bad input are settled once", decoding),
    Case("encoding", "reports byte-exact, schema-valid, with their properties", encoding),
    Case("order", "started first, progress throttled, one terminal report", order),
    Case("retries", "attempts from the delivery count, the limit", retries),
    Case("acknowledgement", "acked only after the terminal report", acknowledgement),
    Case("limits", "id syntax, nesting depth and message size at their edges", limits),
)

OPT_IN: Final = (Case("cancel", "a cancel before delivery, during a run, after the end", cancel),)
