"""The conformance kit against a hand-rolled worker: it passes a correct one, names each defect.

Every worker runs as a process in a vhost of its own (the acknowledgement case reads the
vhost's unacked deliveries), and the kit runs against it as a user runs it, strict, through the
command line (``tests/integration/kit_runs.py``). The runs are independent, so they run side by
side, three at a time (a module fixture), and each test reads its own run's verdicts (this
SDK's reference worker has its own test, on every broker version of CI:
tests/integration/test_conformance_reference.py):

- the hand-rolled worker of ``tests/conformance/raw_worker.py`` (aio-pika and the protocol
  module, no engine, no cancels), strict: every case passes;
- the same worker with mutants (``BREAK``, several at once, one per case: ``mutants.GROUPS``),
  strict: exactly the cases of its mutants fail, each naming its mutant's problem. The mapping
  is docs/conformance.md's table "Each mutant against the case that fails it".
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conformance.mutants import GROUPS, MUTANTS, group_of
from tests.integration.conftest import broker, broker_status
from tests.integration.kit_runs import ALL_CASES, Run, run_kit, start_subject

# The broker fixtures of the integration tests, used here by name.
__all__ = ["broker", "broker_status"]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: Kits run at once: each runs a worker and calls ``rabbitmqctl`` (about a second a call, all
#: CPU); three at once, beside the rest of the suite, is the load the acceptance asks for.
KITS_AT_ONCE = 3


@pytest.fixture(scope="module")
def runs(broker: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Every worker of this module, and the kit run against each, ``KITS_AT_ONCE`` at a time."""
    logs = tmp_path_factory.mktemp("conformance")
    small = {"WORKER_MAX_MESSAGE_BYTES": str(1024 * 1024)}
    raw = [sys.executable, "-m", "tests.conformance.raw_worker"]
    starts = [
        ("raw", raw, small),
        *((group_of(group[0]), raw, {**small, "BREAK": ",".join(group)}) for group in GROUPS),
    ]

    def one(start: tuple[str, list[str], dict[str, str]]) -> tuple[str, Run]:
        subject = start_subject(*start, logs)
        return subject.name, run_kit(subject, logs, [])

    with ThreadPoolExecutor(KITS_AT_ONCE) as pool:
        return dict(pool.map(one, starts))


def test_a_hand_rolled_worker_that_keeps_every_rule_passes_every_case_strict(
    runs: dict[str, Run],
) -> None:
    run = runs["raw"]
    assert run.code == 0, run.explain()
    assert run.verdicts == dict.fromkeys(ALL_CASES, "pass"), run.explain()


@pytest.mark.parametrize("group", GROUPS, ids=[group_of(group[0]) for group in GROUPS])
def test_a_worker_with_mutants_fails_their_cases_and_no_other(
    runs: dict[str, Run], group: tuple[str, ...]
) -> None:
    run = runs[group_of(group[0])]
    assert run.code == 1, run.explain()
    assert set(run.verdicts) == ALL_CASES, run.explain()
    assert run.failed() == {MUTANTS[mode].case for mode in group}, run.explain()


@pytest.mark.parametrize("mode", list(MUTANTS))
def test_each_mutant_fails_its_case_with_a_line_that_names_it(
    runs: dict[str, Run], mode: str
) -> None:
    mutant = MUTANTS[mode]
    run = runs[group_of(mode)]
    assert run.verdicts.get(mutant.case) == "fail", run.explain()
    assert mutant.line in run.problems[mutant.case], run.explain()
