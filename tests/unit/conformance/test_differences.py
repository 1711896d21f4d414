"""What a verdict's line says of a difference (``conformance.differences``): where the bytes
part, the first path whose value or type is not the handler's, a schema error's path and
keyword."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from async_task_api_worker.conformance.differences import (
    MISSING,
    byte_difference,
    schema_lines,
    value_difference,
)
from async_task_api_worker.conformance.report_rules import RULED_FIELDS, read_json
from async_task_api_worker.protocol.encoding import canonical_dumps
from async_task_api_worker.protocol.schemas import load_schema
from tests.unit.protocol.protocol_strategies import json_values, valid_texts

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------------------------- bytes


def test_the_byte_line_gives_the_offset_and_both_sides_around_it() -> None:
    expected = b'{"a":1,"b":2}'
    actual = b'{"b":2,"a":1}'
    assert byte_difference(expected, actual) == (
        'at byte 2 (of 13 expected, 13 sent): expected b\'{"a":1,"b":2}\', sent b\'{"b":2,"a":1}\''
    )


def test_the_byte_line_shows_30_bytes_each_side_and_marks_what_it_leaves_out() -> None:
    head, tail = b"h" * 100, b"t" * 100
    line = byte_difference(head + b"1" + tail, head + b"2" + tail)
    assert line.startswith("at byte 100 (of 201 expected, 201 sent): ")
    assert f"expected ...{b'h' * 30 + b'1' + b't' * 29!r}..." in line
    assert f"sent ...{b'h' * 30 + b'2' + b't' * 29!r}..." in line


def test_a_body_that_stops_short_differs_where_it_ends() -> None:
    line = byte_difference(b'{"a":1.0}', b'{"a":1')
    assert line.startswith("at byte 6 (of 9 expected, 6 sent): ")
    assert line.endswith("""expected b'{"a":1.0}', sent b'{"a":1'""")


# ------------------------------------------------------------------------------- values


def _read(value: Any) -> Any:
    """``value`` as the kit reads it from a report: its number types kept."""
    document = read_json(canonical_dumps({"v": value}))
    assert document is not None
    return document["v"]


@pytest.mark.parametrize(
    ("expected", "sent", "line"),
    [
        ({"a": 1.0}, {"a": 1}, "response.a: 1 (int) where 1.0 (float) was returned"),
        ({"a": 1}, {"a": 1.0}, "response.a: 1.0 (float) where 1 (int) was returned"),
        ({"a": 0.0}, {"a": -0.0}, "response.a: -0.0 (float) where 0.0 (float) was returned"),
        ({"a": [1, {"y": 2}]}, {"a": [1, {"y": 2.0}]}, "response.a[1].y: 2.0 (float) where 2 "),
        ({"a": [1, 2]}, {"a": [1]}, "response.a[1]: missing where 2 (int) was returned"),
        ({"a": 1}, {"a": 1, "b": None}, "response.b: null where nothing was returned"),
        ({"é z": "x"}, {"é z": "y"}, 'response["é z"]: "y" (string) where "x" (string) was'),
        ({"a": True}, {"a": 1}, "response.a: 1 (int) where true (bool) was returned"),
        ({}, None, "response: null where {} (object) was returned"),
    ],
)
def test_the_first_path_that_differs_is_named_with_both_types(
    expected: Any, sent: Any, line: str
) -> None:
    difference = value_difference(expected, _read(sent), "response")
    assert difference is not None
    assert difference.startswith(line)


def test_the_first_difference_is_the_first_in_canonical_key_order() -> None:
    sent = _read({"z": 2, "b": 2, "a": 1})
    assert value_difference({"z": 1, "b": 1, "a": 1}, sent, "response") == (
        "response.b: 2 (int) where 1 (int) was returned"
    )


def test_a_missing_field_and_the_verb_of_a_progress_report() -> None:
    expected = {"fraction": 0.25, "payload": {"k": 0.5}}
    sent = {"fraction": MISSING, "payload": _read({"k": 0.5})}
    assert value_difference(expected, sent, "", "reported") == (
        "fraction: missing where 0.25 (float) was reported"
    )


@FAST
@given(json_values(keys=valid_texts, strings=valid_texts))
def test_a_value_read_back_with_its_types_kept_has_no_difference(value: Any) -> None:
    assert value_difference(value, _read(value), "response") is None


# ------------------------------------------------------------------------------- schema


def _errors(document: Any) -> Any:
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped,unused-ignore]

    return Draft202012Validator(load_schema("report")).iter_errors(document)


STARTED = {
    "attempt": 1,
    "client_id": "c",
    "protocol_version": 1,
    "service": "s",
    "task_id": "t",
    "timestamp": "2026-11-29T22:48:46.123456Z",
    "type": "started",
}


def test_a_schema_error_is_its_path_keyword_and_message_not_the_document() -> None:
    lines = schema_lines(_errors({**STARTED, "task_id": "t 1"}))
    assert lines == [
        "$.task_id (pattern): 't 1' does not match '^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$'"
    ]


def test_a_report_is_judged_by_the_branch_of_its_type() -> None:
    # Every branch of the oneOf fails; the started one by the timestamp alone.
    lines = schema_lines(_errors({**STARTED, "timestamp": "2026-11-29T22:48:46.123Z"}))
    assert len(lines) == 1
    assert lines[0].startswith("$.timestamp (pattern): '2026-11-29T22:48:46.123Z' does not match")


def test_at_most_two_errors_each_cut_short() -> None:
    document = {**STARTED, "task_id": "x " * 200, "service": "y " * 200, "extra": 1}
    lines = schema_lines(_errors(document))
    assert len(lines) == 2
    assert all(len(line) < 140 for line in lines), lines


def test_an_object_the_message_quotes_is_named_not_printed() -> None:
    [line] = schema_lines(_errors({**STARTED, "type": "failure", "error": ["x"] * 100}))
    assert line == "$.error (type): the array is not of type 'object'"


def test_errors_of_the_fields_the_every_report_rules_judge_are_left_to_them() -> None:
    document = {**STARTED, "timestamp": "2026-11-29T22:48:46Z", "attempt": 0}
    del document["client_id"]
    assert schema_lines(_errors(document), leave=RULED_FIELDS) == []
    assert len(schema_lines(_errors(document), at_most=5)) == 3
    del document["task_id"]
    assert schema_lines(_errors(document), leave=RULED_FIELDS) == [
        "$ (required): 'task_id' is a required property"
    ]
