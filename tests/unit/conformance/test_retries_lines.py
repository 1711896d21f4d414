"""What the ``retries`` case's lines show of a task that loops on requeue: a capped list
(``case.capped``, ``case.kinds``), and a hint when the attempt never grew
(``settle_cases.never_grew``, counting deliveries by their first report)."""

from __future__ import annotations

from async_task_api_worker.conformance.case import SHOWN, capped, kinds
from async_task_api_worker.conformance.report_rules import Seen
from async_task_api_worker.conformance.settle_cases import deliveries, never_grew
from tests.unit.conformance.kit_setup import report

TID = "cf-r1-retries-3"


def _report(kind: str = "started", *, seq: int = 0, attempt: int = 1) -> Seen:
    return report(kind, task_id=TID, seq=seq, attempt=attempt)


# ------------------------------------------------------------------------------- lists


def test_a_line_shows_the_first_items_and_how_many_more() -> None:
    pairs = [(2, "started")] * 500
    line = capped(pairs)
    assert line.startswith("(2, 'started'), (2, 'started')")
    assert line.count("(2, 'started')") == SHOWN
    assert line.endswith(f", ... {500 - SHOWN} more")
    assert capped([1, 2]) == "1, 2"
    assert capped([]) == ""


def test_the_kinds_of_a_task_looping_on_requeue_are_capped_too() -> None:
    reports = [_report(attempt=2)] * 3000
    assert kinds(reports) == ",".join(["started"] * SHOWN) + ",... 2,988 more"
    assert kinds([]) == "nothing"


def test_deliveries_are_counted_by_their_first_report() -> None:
    reports = [_report(), _report(seq=1), _report(attempt=2), _report("success", seq=1, attempt=2)]
    assert deliveries(reports) == 2
    assert deliveries([]) == 0


def test_a_task_whose_attempt_never_grew_gets_a_hint() -> None:
    looping = [_report(attempt=2) for _ in range(40)]
    assert never_grew(looping) == (
        "; the attempt never grew (40 deliveries, each attempt 2): read x-delivery-count"
    )
    growing = [_report(attempt=4), _report(attempt=5), _report("failure", seq=1, attempt=5)]
    assert never_grew(growing) == ""
    # One delivery with two started reports (seq 0 and 1) is not a loop.
    assert never_grew([_report(attempt=3), _report(seq=1, attempt=3)]) == ""
