"""docs/conformance.md's table of mutants is the mapping the conformance tests check.

tests/conformance/test_kit_on_rabbitmq.py runs the kit on the raw worker with each mutant of
``tests.conformance.mutants`` and checks its row; this checks that the doc shows those rows,
and that every ``BREAK`` mode of the raw worker is a mutant run by a group.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.conformance.mutants import GROUPS, MUTANTS, table
from tests.conformance.raw_worker import BREAK_MODES

DOC = Path(__file__).resolve().parents[3] / "docs" / "conformance.md"


def test_the_docs_mutant_table_is_the_mapping_the_tests_check() -> None:
    assert table() in DOC.read_text(), (
        f"docs/conformance.md must hold the table of tests/conformance/mutants.py:\n{table()}"
    )


def test_every_break_mode_is_a_mutant_in_exactly_one_group_of_distinct_cases() -> None:
    assert MUTANTS.keys() == BREAK_MODES.keys()
    assert Counter(mode for group in GROUPS for mode in group) == Counter(MUTANTS.keys())
    for group in GROUPS:
        cases = [MUTANTS[mode].case for mode in group]
        assert len(set(cases)) == len(cases), group
