"""The fault suite's ledger counts by the protocol's rule for ``message_id`` (docs/protocol.md,
"Report order"): unique per delivery only, so never the key of a terminal report alone."""

from __future__ import annotations

import json
from pathlib import Path

from tests.faults.ledger import Ledger


def _report(kind: str, stamp: str, **extra: object) -> bytes:
    fields = {"task_id": "t-1", "attempt": 1, "type": kind, "timestamp": stamp, **extra}
    return json.dumps(fields).encode()


def test_a_terminal_report_reusing_an_earlier_hand_outs_message_id_is_counted(
    tmp_path: Path,
) -> None:
    # RabbitMQ 4.3: the hand-out limit's failure is seq 0 of attempt 1, like the started of
    # the first hand-out (measured: TASK_ABANDONED_AFTER_REDELIVERIES after a consumer timeout).
    ledger = Ledger()
    ledger.add(_report("started", "s1"), "t-1/1/0")
    ledger.add(_report("failure", "s2", error={"code": "TASK_ABANDONED"}), "t-1/1/0")
    counts = ledger.count(["t-1"], tmp_path, hung=0)
    assert counts.lost == []
    assert counts.codes == {"TASK_ABANDONED": 1}


def test_the_same_report_published_again_counts_once(tmp_path: Path) -> None:
    ledger = Ledger()
    for _ in range(2):
        ledger.add(_report("success", "s1"), "t-1/1/1")
    assert ledger.count(["t-1"], tmp_path, hung=0).duplicate_successes == []


def test_two_successes_of_one_attempt_number_are_a_duplicate(tmp_path: Path) -> None:
    # RabbitMQ 4.3 hands attempt 1 out again after a consumer timeout: both runs may succeed.
    ledger = Ledger()
    ledger.add(_report("success", "s1"), "t-1/1/1")
    ledger.add(_report("success", "s2"), "t-1/1/1")
    assert ledger.count(["t-1"], tmp_path, hung=0).duplicate_successes == ["t-1"]
