"""Encoding reports: refusals, limits and AMQP properties (docs/protocol.md, "Reports")."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from async_task_api_worker.errors import ProtocolError, ReportEncodeError
from async_task_api_worker.protocol import (
    MAX_NESTING_DEPTH,
    MAX_REPORT_BYTES,
    FailureReport,
    MessageProperties,
    ProgressReport,
    ReportError,
    StartedReport,
    SuccessReport,
    canonical_dumps,
    decode_report,
    encode_report,
    format_timestamp,
)

FIELDS: dict[str, Any] = {
    "task_id": "t-1",
    "client_id": "c-1",
    "service": "svc",
    "attempt": 2,
    "timestamp": "2026-11-29T22:48:46.123456Z",
}


def success(response: dict[str, Any]) -> SuccessReport:
    # model_construct, as the engine does: the encoder, not the model, must refuse bad values.
    return SuccessReport.model_construct(**FIELDS, response=response)


def nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


# ----------------------------------------------------------------------- refusals


def test_a_report_over_max_bytes_is_refused_as_too_large() -> None:
    report = success({"text": "x" * 100})
    size = len(encode_report(report).body)
    assert encode_report(report, max_bytes=size).body
    with pytest.raises(ReportEncodeError) as caught:
        encode_report(report, max_bytes=size - 1)
    assert caught.value.too_large is True
    assert str(caught.value) == f"success report of {size} bytes exceeds {size - 1} bytes"


def test_the_default_report_limit_is_16_mib() -> None:
    assert MAX_REPORT_BYTES == 16 * 1024 * 1024
    overhead = len(encode_report(success({"t": ""})).body)
    fits = success({"t": "x" * (MAX_REPORT_BYTES - overhead)})
    assert len(encode_report(fits).body) == MAX_REPORT_BYTES
    with pytest.raises(ReportEncodeError) as caught:
        encode_report(success({"t": "x" * (MAX_REPORT_BYTES - overhead + 1)}))
    assert caught.value.too_large


@pytest.mark.parametrize(
    "value",
    [
        {1, 2},
        b"bytes",
        object(),
        Decimal("1.5"),
        datetime(2026, 1, 1, tzinfo=UTC),
        {"nested": [{"deeper": frozenset()}]},
    ],
    ids=["set", "bytes", "object", "decimal", "datetime", "nested-frozenset"],
)
def test_a_value_that_is_not_json_is_refused(value: object) -> None:
    with pytest.raises(ReportEncodeError) as caught:
        encode_report(success({"value": value}))
    assert caught.value.too_large is False
    assert str(caught.value) == "value is not canonical JSON: TypeError"


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinities_are_refused(number: float) -> None:
    with pytest.raises(ReportEncodeError) as caught:
        encode_report(success({"value": [1, {"x": number}]}))
    assert caught.value.too_large is False
    assert str(caught.value) == "value is not canonical JSON: ValueError"


def test_a_nan_fraction_is_refused() -> None:
    report = ProgressReport.model_construct(**FIELDS, fraction=float("nan"), payload=None)
    with pytest.raises(ReportEncodeError):
        encode_report(report)


@pytest.mark.parametrize("key", [1, 1.5, True, None])
def test_a_key_that_is_not_a_string_is_refused(key: object) -> None:
    # json.dumps would write {1: "a"} as {"1": "a"}, which reads back as another value.
    with pytest.raises(ReportEncodeError) as caught:
        canonical_dumps({"outer": {key: "a"}})
    assert str(caught.value) == "value has an object key that is not a string"


def test_nesting_is_limited_to_64_levels_counting_the_report() -> None:
    assert MAX_NESTING_DEPTH == 64
    assert canonical_dumps(nested(64)) == b"[" * 64 + b"0" + b"]" * 64
    with pytest.raises(ReportEncodeError, match="nests deeper than 64 levels"):
        canonical_dumps(nested(65))
    # The report object is the first level, the response the second.
    assert encode_report(success({"x": nested(62)})).body
    with pytest.raises(ReportEncodeError, match="nests deeper"):
        encode_report(success({"x": nested(63)}))


def test_a_self_referencing_value_is_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ReportEncodeError):
        canonical_dumps({"loop": loop})


def test_integers_up_to_4300_digits() -> None:
    assert canonical_dumps(10**4300 - 1) == b"9" * 4300
    assert canonical_dumps(-(10**4300 - 1)) == b"-" + b"9" * 4300
    with pytest.raises(ReportEncodeError):
        canonical_dumps(10**4300)


def test_tuples_are_arrays_and_subclasses_are_their_base_type() -> None:
    class Code(str):
        __slots__ = ()

    assert canonical_dumps({"t": (1, (2,)), "s": Code("x"), "b": True}) == (
        b'{"b":true,"s":"x","t":[1,[2]]}'
    )


# ----------------------------------------------------------------------- round trip, properties


def test_every_field_of_a_report_is_written_even_when_null() -> None:
    report = ProgressReport(**FIELDS, fraction=0.5)
    document = json.loads(encode_report(report).body)
    assert document["payload"] is None
    assert document["protocol_version"] == 1
    assert list(document) == sorted(document)


def test_message_properties() -> None:
    report = FailureReport(**FIELDS, error=ReportError(code="X", message="m"))
    properties = encode_report(report, seq=3).properties
    assert properties == MessageProperties(
        message_id="t-1/2/3",
        correlation_id="t-1",
        type="failure",
        timestamp_s=1795992526,
        app_id="svc",
        content_type="application/json",
        content_encoding="utf-8",
        delivery_mode=2,
    )


def test_format_timestamp_writes_utc_with_microseconds() -> None:
    moment = datetime(2026, 11, 29, 23, 48, 46, 5, tzinfo=timezone(timedelta(hours=1)))
    assert format_timestamp(moment) == "2026-11-29T22:48:46.000005Z"


def test_a_lone_surrogate_in_an_error_message_round_trips() -> None:
    report = FailureReport(**FIELDS, error=ReportError(code="X", message="file-\udcff.csv"))
    body = encode_report(report).body
    assert b'"message":"file-\\udcff.csv"' in body
    assert decode_report(body) == report


def test_a_message_is_at_most_1024_characters() -> None:
    assert ReportError(code="X", message="é" * 1024).message == "é" * 1024
    with pytest.raises(ValueError, match="longer than 1024"):
        ReportError(code="X", message="é" * 1025)


# ----------------------------------------------------------------------- decode_report


def started_body(**changes: Any) -> bytes:
    document = {"protocol_version": 1, "type": "started", **FIELDS, **changes}
    return json.dumps(document).encode()


def test_decode_report_reads_what_encode_report_writes() -> None:
    report = StartedReport(**FIELDS)
    assert decode_report(encode_report(report).body) == report


@pytest.mark.parametrize(
    "body",
    [
        started_body(protocol_version=True),
        started_body(protocol_version=1.0),
        started_body(protocol_version=2),
        started_body(attempt=0),
        started_body(type="finished"),
        started_body(extra="field"),
        started_body(timestamp="2026-11-29T22:48:46Z"),
        started_body().replace(b'"attempt": 2', b'"attempt": 1e400'),
        started_body().replace(b'"attempt": 2', b'"attempt": NaN'),
        b"\xff",
        b"[]",
    ],
)
def test_decode_report_refuses_what_is_not_a_report(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_report(body)
