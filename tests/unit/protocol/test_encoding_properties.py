"""Properties of the canonical encoding (docs/protocol.md, "Canonical encoding")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from async_task_api_worker.conclusion import Failure, Response
from async_task_api_worker.errors import ReportEncodeError
from async_task_api_worker.protocol import (
    FailureReport,
    ProgressReport,
    ReportError,
    StartedReport,
    SuccessReport,
    canonical_dumps,
    decode_report,
    encode_report,
)
from async_task_api_worker.protocol.codes import ERROR_CODE_PATTERN
from async_task_api_worker.protocol.encoding import check_tree, lone_surrogate, strict_loads
from async_task_api_worker.protocol.reports import response_json
from async_task_api_worker.task_call import sendable
from tests.unit.protocol.protocol_strategies import (
    ids,
    joined,
    json_objects,
    json_values,
    plain_texts,
    same,
    service_names,
    texts,
    timestamps,
    valid_texts,
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_NAMED_ESCAPES = {"b": 0x08, "f": 0x0C, "n": 0x0A, "r": 0x0D, "t": 0x09}


def _check_tokens(text: str) -> None:
    """Assert the layout rules: no white space between tokens, only the mandatory escapes."""
    index, in_string = 0, False
    while index < len(text):
        char = text[index]
        if not in_string:
            assert char not in " \t\r\n", f"white space outside a string at {index}"
            in_string = char == '"'
            index += 1
        elif char == '"':
            in_string = False
            index += 1
        elif char == "\\":
            escape = text[index + 1]
            if escape == "u":
                digits = text[index + 2 : index + 6]
                assert digits == digits.lower(), "hex digits must be lower case"
                code = int(digits, 16)
                control = code < 0x20 and code not in _NAMED_ESCAPES.values()
                assert control or 0xD800 <= code <= 0xDFFF, f"needless escape \\u{digits}"
                index += 6
            else:
                assert escape in '"\\' or escape in _NAMED_ESCAPES, f"needless escape \\{escape}"
                index += 2
        else:
            assert ord(char) >= 0x20, "a raw control character inside a string"
            index += 1
    assert not in_string


def _reversed(value: Any) -> Any:
    """The same value with every object's insertion order reversed."""
    if isinstance(value, dict):
        return {key: _reversed(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed(item) for item in value]
    return value


def _keys_collide_when_joined(value: Any) -> bool:
    if isinstance(value, dict):
        if len({joined(key) for key in value}) != len(value):
            return True
        return any(_keys_collide_when_joined(item) for item in value.values())
    if isinstance(value, list):
        return any(_keys_collide_when_joined(item) for item in value)
    return False


@FAST
@given(json_values())
def test_canonical_bytes_read_back_as_the_same_value(value: Any) -> None:
    assume(not _keys_collide_when_joined(value))
    body = canonical_dumps(value)
    text = body.decode("utf-8")  # strict: raises if the bytes are not valid UTF-8
    assert same(json.loads(text), joined(value))


@FAST
@given(json_values())
def test_canonical_bytes_have_no_white_space_and_only_mandatory_escapes(value: Any) -> None:
    _check_tokens(canonical_dumps(value).decode("utf-8"))


@FAST
@given(json_values())
def test_encoding_is_deterministic_and_ignores_insertion_order(value: Any) -> None:
    body = canonical_dumps(value)
    assert canonical_dumps(value) == body
    assert canonical_dumps(_reversed(value)) == body


@FAST
@given(json_values(keys=plain_texts))
def test_keys_are_sorted_by_code_point_at_every_level(value: Any) -> None:
    seen: list[list[str]] = []

    def record(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen.append([key for key, _ in pairs])
        return dict(pairs)

    json.loads(canonical_dumps(value), object_pairs_hook=record)
    for keys in seen:
        assert keys == sorted(keys)
        assert len(set(keys)) == len(keys)


@FAST
@given(st.lists(st.sampled_from("a\ud800b\udc00\U0001f600\x01\u2028"), max_size=12).map("".join))
def test_lone_surrogates_are_escaped_and_nothing_else_changes(text: str) -> None:
    body = canonical_dumps(text)
    expected = joined(text)
    for char in expected:
        if 0xD800 <= ord(char) <= 0xDFFF:
            assert f"\\u{ord(char):04x}".encode() in body
    assert json.loads(body) == expected


# --------------------------------------------------------------------- reports round trip

_common = {
    "task_id": ids,
    "client_id": ids,
    "service": service_names,
    "attempt": st.integers(min_value=1, max_value=10**6),
    "timestamp": timestamps,
}


def _round_trip(report: StartedReport | ProgressReport | SuccessReport | FailureReport) -> None:
    encoded = encode_report(report)
    decoded = decode_report(encoded.body)
    assert type(decoded) is type(report)
    # What a reader gets is the report with its strings joined (see `joined`), and encoding
    # that gives the very same bytes again.
    expected = type(report).model_validate(joined(report.model_dump(mode="python")))
    assert decoded == expected
    assert same(decoded.model_dump(mode="python"), expected.model_dump(mode="python"))
    assert encode_report(decoded).body == encode_report(expected).body


_valid_objects = json_objects(keys=valid_texts, strings=valid_texts)


@FAST
@given(st.fixed_dictionaries(_common), _valid_objects)
def test_success_reports_round_trip(fields: dict[str, Any], response: dict[str, Any]) -> None:
    _round_trip(SuccessReport(**fields, response=response))


@FAST
@given(
    st.fixed_dictionaries(_common),
    st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    st.none() | _valid_objects,
)
def test_progress_reports_round_trip(
    fields: dict[str, Any], fraction: float, payload: dict[str, Any] | None
) -> None:
    _round_trip(ProgressReport(**fields, fraction=fraction, payload=payload))


def _holds_a_surrogate(value: Any) -> bool:
    """Whether a string or key of ``value`` holds a code point U+D800 to U+DFFF."""
    if isinstance(value, str):
        return any(0xD800 <= ord(char) <= 0xDFFF for char in value)
    if isinstance(value, dict):
        return any(
            _holds_a_surrogate(key) or _holds_a_surrogate(item) for key, item in value.items()
        )
    if isinstance(value, list):
        return any(_holds_a_surrogate(item) for item in value)
    return False


@FAST
@given(st.fixed_dictionaries(_common), json_objects(), st.booleans())
def test_a_response_or_payload_is_refused_if_and_only_if_it_holds_a_lone_surrogate(
    fields: dict[str, Any], value: dict[str, Any], escaped: bool
) -> None:
    if escaped:
        # As a child's answer or a result file carries it: "\udxxx" escapes, a pair joined.
        value = strict_loads(json.dumps(value))
    reports = (
        SuccessReport(**fields, response=value),
        ProgressReport(**fields, fraction=0.5, payload=value),
    )
    concluded = sendable(Response(value))  # a child that writes its conclusion itself
    if not _holds_a_surrogate(value):
        for report in reports:
            _round_trip(report)
        assert concluded == Response(value)
        return
    refusal = r"^value is not valid Unicode: a lone surrogate U\+D[89A-F][0-9A-F]{2} "
    for report in reports:
        with pytest.raises(ReportEncodeError, match=refusal):
            encode_report(report)
    assert isinstance(concluded, Failure) and concluded.code == "INVALID_RESULT"
    assert concluded.message.startswith("the handler's result cannot be reported: value is not")


_steps = st.lists(st.from_regex(r"[a-z_]{1,6}", fullmatch=True) | st.integers(0, 3), max_size=6)


@FAST
@given(
    st.dictionaries(valid_texts, st.integers() | valid_texts, max_size=4),
    st.from_regex(r"[a-z]{1,6}", fullmatch=True),
    _steps,
    st.characters(categories=["Cs"]),
    st.booleans(),
)
def test_the_refusal_names_the_surrogate_and_where_it_is(
    others: dict[str, Any], first: str, steps: list[str | int], surrogate: str, in_a_key: bool
) -> None:
    text = f"x{surrogate}y"
    inner: Any = {text: 1} if in_a_key else text
    for step in reversed(steps):
        inner = {step: inner} if isinstance(step, str) else [None] * step + [inner]
    value = {**others, first: inner}
    place = ".".join(str(step) for step in (first, *steps))
    code_point = f"U+{ord(surrogate):04X}"
    expected = (
        f"{code_point} in a key at {place}.x\\u{ord(surrogate):04x}y"
        if in_a_key
        else f"{code_point} at {place}"
    )
    assert lone_surrogate(value) == expected
    with pytest.raises(ReportEncodeError) as refused:
        check_tree(value, valid_unicode=True)
    assert str(refused.value) == f"value is not valid Unicode: a lone surrogate {expected}"
    check_tree(value)  # escaped by the encoder where it may be: an error message, an input


@FAST
@given(
    st.fixed_dictionaries({**_common, "client_id": st.none() | ids}),
    st.from_regex(ERROR_CODE_PATTERN, fullmatch=True),
    texts | st.text(max_size=1024),
)
def test_failure_and_started_reports_round_trip(
    fields: dict[str, Any], code: str, message: str
) -> None:
    _round_trip(FailureReport(**fields, error=ReportError(code=code, message=message)))
    _round_trip(StartedReport(**fields))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    response=json_objects(
        keys=st.one_of(valid_texts, st.sampled_from(["response", "service", "type"])),
        strings=valid_texts,
    ),
    task_id=ids,
    client_id=st.one_of(st.none(), ids),
    service=service_names,
)
def test_a_success_reports_response_is_read_from_its_body_as_encoded_alone(
    response: dict[str, Any], task_id: str, client_id: str | None, service: str
) -> None:
    # Step Functions' output is the response: read from the report's body, never encoded again.
    report = SuccessReport.model_construct(
        protocol_version=1,
        type="success",
        task_id=task_id,
        client_id=client_id,
        service=service,
        attempt=1,
        timestamp="2026-01-01T00:00:00.000000Z",
        response={"nested": response, "service": "x", "response": response},
    )
    encoded = encode_report(report)
    assert response_json(encoded) == canonical_dumps(report.response)
