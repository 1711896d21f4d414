"""Each mutant of the raw worker, the one case of the kit that fails it, and the kit's line.

docs/conformance.md's table "Each mutant against the case that fails it" is this mapping as
:func:`table` renders it (tests/unit/conformance/test_mutant_table.py checks the doc against
it), and tests/conformance/test_kit_on_rabbitmq.py runs the kit on the raw worker with the
mutants, a group of them per worker (:data:`GROUPS`), and checks every row: the case fails,
its failure names the mutant's problem (``line``), and no case of no other mutant fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from tests.conformance.raw_worker import BREAK_MODES

__all__ = ["GROUPS", "MUTANTS", "Mutant", "group_of", "table"]


@dataclass(frozen=True, slots=True)
class Mutant:
    """The case that fails a mutant, and a part of the line the kit prints for it there."""

    case: str
    line: str


#: Every ``BREAK`` mode of tests/conformance/raw_worker.py, in the order of the kit's cases.
MUTANTS: Final = {
    "version_float": Mutant("round_trip", "protocol_version is 1.0, not 1"),
    "client_id_null": Mutant("round_trip", 'client_id is null, not "conformance-kit"'),
    "timestamps_backwards": Mutant("round_trip", "an earlier report's in the same delivery"),
    "poison_acked": Mutant("decoding", "acked, not rejected (never dead-lettered)"),
    "poison_requeued": Mutant("decoding", "poison bodies still or again in the input queue"),
    "unsorted_keys": Mutant("encoding", "not the canonical encoding"),
    "non_persistent": Mutant("encoding", "delivery_mode is 1"),
    "message_uncut": Mutant("encoding", "over the limit of 1,024"),
    "started_twice": Mutant("order", "2 started reports in one delivery, not one"),
    "progress_one": Mutant("order", "fraction is 1.0, not a float in [0, 1)"),
    "progress_after_terminal": Mutant("order", "after the terminal report"),
    "local_attempts": Mutant("retries", "expected started and success at attempt 3"),
    "ack_early": Mutant("acknowledgement", "the input was acked"),
    "depth_unchecked": Mutant("limits", "a body nesting 65 levels: expected a failure"),
}

#: The mutants each broken worker carries at once: one per case at most, so that a failed case
#: names one mutant, and each group leaves cases that must pass, so that a mutant that also
#: tripped another case (``started_twice`` in ``retries``, a report-wide rule in a later case)
#: would show.
GROUPS: Final = (
    ("version_float", "poison_acked", "non_persistent", "started_twice", "ack_early"),
    ("client_id_null", "poison_requeued", "message_uncut", "progress_one", "local_attempts"),
    ("timestamps_backwards", "unsorted_keys", "progress_after_terminal", "depth_unchecked"),
)


def group_of(mode: str) -> str:
    """The name of the broken worker that carries ``mode`` (``broken-<n>``, from 1)."""
    return next(f"broken-{n}" for n, group in enumerate(GROUPS, 1) if mode in group)


def table() -> str:
    """The Markdown table of docs/conformance.md: mutant, what it does, its case, its line."""
    rows = [
        "| Mutant (`BREAK=`) | What it does | The case that fails it | The kit's line holds |",
        "| --- | --- | --- | --- |",
    ]
    rows.extend(
        f"| `{mode}` | {BREAK_MODES[mode]} | `{mutant.case}` | `{mutant.line}` |"
        for mode, mutant in MUTANTS.items()
    )
    return "\n".join(rows)
