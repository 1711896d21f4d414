"""The rules every report is held to, whatever the case (``conformance.report_rules``), and the
encoding case's message cut: read with number types kept, echoed fields, timestamps in order."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from async_task_api_worker.conformance.case import envelope, per_attempt
from async_task_api_worker.conformance.report_cases import LONG_MESSAGE, cut_problem
from async_task_api_worker.conformance.report_rules import Float, ReportRules, Seen, read_json
from async_task_api_worker.protocol import MAX_ERROR_MESSAGE_CHARS
from async_task_api_worker.protocol.encoding import canonical_dumps
from tests.unit.conformance.kit_setup import SETUP, report
from tests.unit.protocol.protocol_strategies import json_values, texts, valid_texts

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------------------------- reading


def test_a_float_is_never_an_integer_and_a_float_otherwise() -> None:
    assert Float(1.0) != 1
    assert not Float(1.0) == 1  # noqa: SIM201 - __eq__ itself, not __ne__
    assert Float(1.0) != True  # noqa: E712 - a bool is an int
    assert 1 != Float(1.0)  # noqa: SIM300 - the integer on the left: its __eq__ first
    assert Float(1.0) == 1.0
    assert Float(0.25) == Float(0.25)
    assert hash(Float(2.5)) == hash(2.5)
    assert [Float(3.0), Float(3.0)] != [3, 3]
    assert canonical_dumps({"a": Float(1.0), "b": Float(-0.0)}) == b'{"a":1.0,"b":-0.0}'


def _kinds(value: Any) -> Any:
    """``value``'s shape with each number replaced by its kind: what typed reading keeps."""
    if isinstance(value, dict):
        return {key: _kinds(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_kinds(item) for item in value]
    if isinstance(value, float):
        return ("float", repr(float(value)))
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return ("int", value)
    return value


@FAST
@given(json_values(keys=valid_texts, strings=valid_texts))
def test_reading_keeps_every_number_type_and_value(value: Any) -> None:
    body = canonical_dumps({"v": value})
    document = read_json(body)
    assert document is not None
    assert _kinds(document["v"]) == _kinds(value)
    assert canonical_dumps(document) == body


@FAST
@given(st.integers(min_value=-(10**15), max_value=10**15), st.sampled_from([".0", "e0", ".00"]))
def test_an_integral_number_written_as_a_float_never_reads_as_the_integer(
    number: int, suffix: str
) -> None:
    document = read_json(b'{"v":%d%s}' % (number, suffix.encode()))
    assert document is not None
    assert document["v"] != number
    assert isinstance(document["v"], Float)


@pytest.mark.parametrize(
    "body", [b"\xff", b"[1]", b'{"v":NaN}', b'{"v":1e400}', b'{"v":', b'{"v":Infinity}']
)
def test_a_body_that_is_not_a_strict_json_object_reads_as_none(body: bytes) -> None:
    assert read_json(body) is None


# ------------------------------------------------------------------------------- the rules

TID = "cf-r1-case-1"


def _report(kind: str = "started", **fields: Any) -> Seen:
    return report(kind, task_id=TID, **fields)


def _raw(text: bytes, seq: int = 0) -> Seen:
    """A report whose bytes are given (a worker that writes ``1.0`` for ``1``)."""
    return Seen(text, read_json(text), {"message_id": f"{TID}/1/{seq}"}, 0.0)


def _rules(*bodies: bytes) -> ReportRules:
    rules = ReportRules()
    for body in bodies or (envelope(SETUP, TID, {"behaviour": "succeed"}),):
        rules.sent(body)
    return rules


def test_reports_that_echo_the_envelope_break_no_rule() -> None:
    rules = _rules()
    assert rules.check(_report(), "conformance") == []
    progress = _report("progress", seq=1, fraction=0.0, payload=None)
    assert rules.check(progress, "conformance") == []
    assert rules.check(_report("success", seq=2, response={}), "conformance") == []


def test_protocol_version_written_1_0_is_caught_though_its_bytes_are_canonical() -> None:
    body = _report().body.replace(b'"protocol_version":1,', b'"protocol_version":1.0,')
    assert canonical_dumps(read_json(body)) == body
    assert _rules().check(_raw(body), "conformance") == [
        f"{TID}/1/0: protocol_version is 1.0, not 1"
    ]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"client_id": None}, 'client_id is null, not "conformance-kit" (the envelope\'s)'),
        ({"service": "other"}, 'service is "other", not the worker\'s "conformance"'),
        ({"attempt": 1.0}, "attempt is 1.0, not an integer of at least 1"),
        ({"attempt": True}, "attempt is true, not an integer of at least 1"),
        ({"attempt": 0}, "attempt is 0, not an integer of at least 1"),
        ({"protocol_version": 2}, "protocol_version is 2, not 1"),
    ],
)
def test_each_echoed_field_and_number_type_is_checked(fields: dict[str, Any], problem: str) -> None:
    [line] = _rules().check(_report(**fields), "conformance")
    assert line.endswith(problem)


def test_a_missing_client_id_is_not_taken_for_null() -> None:
    body = _report().body.replace(b'"client_id":"conformance-kit",', b"")
    assert _rules(envelope(SETUP, TID, {}, client_id=None)).check(_raw(body), "conformance") == [
        f"{TID}/1/0: client_id is missing, not null (as recovered from the poison body)"
    ]


@pytest.mark.parametrize("fraction", [1.0, 0, -0.5, "0.5", None])
def test_a_progress_fraction_is_a_float_in_0_to_1(fraction: object) -> None:
    report = _report("progress", fraction=fraction, payload=None)
    [line] = _rules().check(report, "conformance")
    assert "not a float in [0, 1)" in line


def test_a_poison_failure_echoes_the_client_id_the_worker_can_recover() -> None:
    unreadable = envelope(SETUP, TID, {}, client_id="not an id")
    rules = _rules(unreadable)
    failure = _report("failure", client_id=None, error={"code": "POISON_MESSAGE", "message": "m"})
    assert rules.check(failure, "conformance") == []
    recovered = _rules(envelope(SETUP, TID, {}, protocol_version=2))
    assert recovered.check(failure, "conformance") == [
        f'{TID}/1/0: client_id is null, not "conformance-kit" (as recovered from the poison body)'
    ]


def test_reports_of_a_task_the_kit_never_sent_are_left_to_the_cases() -> None:
    rules = _rules(envelope(SETUP, "another", {}))
    assert rules.check(_report(client_id=None, protocol_version=2), "conformance") == []
    assert rules.check(_raw(b"not json"), "conformance") == []


def test_each_rule_is_reported_once_a_run() -> None:
    rules = _rules()
    first = rules.check(_report(client_id=None), "conformance")
    again = rules.check(_report("success", seq=1, client_id=None, response={}), "conformance")
    other = rules.check(_report("success", seq=2, service="x", response={}), "conformance")
    assert len(first) == 1
    assert again == []
    assert len(other) == 1


def test_a_timestamp_earlier_than_one_of_its_delivery_is_caught() -> None:
    rules = _rules()
    assert rules.check(_report(at="2026-11-29T22:48:47.000000Z"), "conformance") == []
    later = _report("success", seq=1, at="2026-11-29T22:48:46.999999Z", response={})
    assert rules.check(later, "conformance") == [
        f"{TID}/1/1: timestamp 2026-11-29T22:48:46.999999Z goes back from "
        f"2026-11-29T22:48:47.000000Z, an earlier report's in the same delivery"
    ]


@pytest.mark.parametrize(
    ("stamp", "shown"),
    [
        ("2026-11-29T22:48:46.123Z", '"2026-11-29T22:48:46.123Z"'),
        ("2026-11-29T22:48:46Z", '"2026-11-29T22:48:46Z"'),
        ("2026-11-29T22:48:46.123456+00:00", '"2026-11-29T22:48:46.123456+00:00"'),
        (1764456526, "1764456526"),
    ],
)
def test_a_timestamp_of_another_form_breaks_a_rule_of_every_report(
    stamp: object, shown: str
) -> None:
    assert _rules().check(_report(at=stamp), "conformance") == [
        f"{TID}/1/0: timestamp is {shown}, not UTC with six fraction digits "
        f"(YYYY-MM-DDTHH:MM:SS.ffffffZ)"
    ]


def test_a_missing_timestamp_breaks_the_form_rule_once_a_run() -> None:
    rules = _rules()
    body = _report().body.replace(b',"timestamp":"2026-11-29T22:48:46.000001Z"', b"")
    assert rules.check(_raw(body), "conformance") == [
        f"{TID}/1/0: timestamp is missing, not UTC with six fraction digits "
        f"(YYYY-MM-DDTHH:MM:SS.ffffffZ)"
    ]
    assert (
        rules.check(
            _report("success", seq=1, at="2026-11-29T22:48:46Z", response={}), "conformance"
        )
        == []
    )


def test_timestamps_are_compared_within_one_delivery_only() -> None:
    rules = _rules()
    stamps = ["2026-11-29T22:48:47.000000Z", "2026-11-29T22:48:47.000000Z"]
    assert rules.check(_report(at=stamps[0]), "conformance") == []
    assert rules.check(_report("progress", seq=1, at=stamps[1], fraction=0.5), "conformance") == []
    # Another attempt, and a new delivery of the same attempt (seq 0 again), start afresh.
    earlier = "2026-11-29T22:48:40.000000Z"
    assert rules.check(_report(at=earlier, attempt=2), "conformance") == []
    assert rules.check(_report(at=earlier), "conformance") == []


# ------------------------------------------------------------------------------- the cut


def test_the_long_message_of_the_encoding_case_is_over_the_limit_in_code_points() -> None:
    assert len(LONG_MESSAGE) > MAX_ERROR_MESSAGE_CHARS
    assert len(LONG_MESSAGE.encode("utf-16-le")) // 2 != len(LONG_MESSAGE)
    assert len(LONG_MESSAGE.encode()) != len(LONG_MESSAGE)


def test_a_message_cut_to_its_first_1024_characters_is_what_the_kit_requires() -> None:
    assert cut_problem(LONG_MESSAGE, LONG_MESSAGE[:MAX_ERROR_MESSAGE_CHARS]) is None
    assert cut_problem("short", "short") is None
    whole = cut_problem(LONG_MESSAGE, LONG_MESSAGE)
    assert whole is not None
    assert "1,500 characters, over the limit of 1,024" in whole
    # Cut in UTF-8 bytes or in UTF-16 units: shorter than the rule, not its first characters.
    by_bytes = LONG_MESSAGE.encode()[:1024].decode(errors="ignore")
    by_units = LONG_MESSAGE.encode("utf-16-le")[:2048].decode("utf-16-le", errors="ignore")
    for wrong in (by_bytes, by_units, LONG_MESSAGE[:1000], LONG_MESSAGE[:1023] + "…"):
        assert "not the handler's message cut to its first 1,024" in str(
            cut_problem(LONG_MESSAGE, wrong)
        )
    assert cut_problem("short", None) == "error.message is NoneType, not a string"


@FAST
@given(texts, st.integers(min_value=0, max_value=1100))
def test_only_the_first_1024_characters_pass_the_cut(start: str, repeat: int) -> None:
    message = start * (repeat // max(len(start), 1) + 1) if start else "x" * repeat
    assert cut_problem(message, message[:MAX_ERROR_MESSAGE_CHARS]) is None
    for length in {0, len(message) - 1, MAX_ERROR_MESSAGE_CHARS + 1}:
        if length >= 0 and message[:length] != message[:MAX_ERROR_MESSAGE_CHARS]:
            assert cut_problem(message, message[:length]) is not None


def test_per_attempt_leaves_out_progress_and_a_report_repeated_in_a_row() -> None:
    reports = [
        _report(),
        _report(seq=1),
        _report("progress", seq=2, fraction=0.5),
        _report("success", seq=3, response={}),
        _report(attempt=2),
    ]
    assert per_attempt(reports) == [(1, "started"), (1, "success"), (2, "started")]
    # An attempt written 1.0 is attempt 1 here: its number type is report_rules' to judge,
    # once a run, so that a worker writing it fails one case, not every case judging attempts.
    assert per_attempt([_raw(_report().body.replace(b'"attempt":1', b'"attempt":1.0'))]) == [
        (1, "started")
    ]
