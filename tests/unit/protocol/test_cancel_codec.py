"""The cancel request codec, case by case (docs/protocol.md, "Cancelling a task")."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from async_task_api_worker.errors import CancelDecodeError, FatalError, ProtocolError
from async_task_api_worker.protocol import (
    MAX_CANCEL_BYTES,
    RESERVED_ERROR_CODES,
    CancelDecodeReason,
    ErrorCode,
    decode_cancel,
    encode_cancel,
)
from async_task_api_worker.protocol.cancel import CANCEL_DELIVERY_MODE

MOMENT = datetime(2026, 11, 29, 22, 48, 46, 123456, tzinfo=UTC)


def _body(**changes: Any) -> bytes:
    document: dict[str, Any] = {
        "protocol_version": 1,
        "type": "cancel",
        "task_id": "t-0001",
        "client_id": "client-a",
        "timestamp": "2026-11-29T22:48:46.123456Z",
    }
    document.update(changes)
    return json.dumps(document, ensure_ascii=False).encode()


def _refusal(body: bytes) -> CancelDecodeError:
    with pytest.raises(CancelDecodeError) as caught:
        decode_cancel(body)
    return caught.value


# ------------------------------------------------------------------------------- encoding


def test_encode_gives_the_canonical_bytes_and_the_properties() -> None:
    body, properties = encode_cancel("t-0001", "client-a", MOMENT)
    assert body == (
        b'{"client_id":"client-a","protocol_version":1,"task_id":"t-0001",'
        b'"timestamp":"2026-11-29T22:48:46.123456Z","type":"cancel"}'
    )
    assert properties.content_type == "application/json"
    assert properties.content_encoding == "utf-8"
    assert properties.delivery_mode == CANCEL_DELIVERY_MODE == 1
    assert properties.message_id == "t-0001/cancel"
    assert properties.correlation_id == "t-0001"
    assert properties.type == "cancel"
    assert properties.timestamp_s == 1_795_992_526
    assert properties.app_id == "client-a"
    assert properties.headers == {}


def test_encode_writes_the_moment_in_utc() -> None:
    paris = timezone(timedelta(hours=1))
    body, _ = encode_cancel("t-1", "c-1", datetime(2026, 11, 29, 23, 48, 46, tzinfo=paris))
    assert b'"timestamp":"2026-11-29T22:48:46.000000Z"' in body


def test_encode_refuses_a_naive_moment() -> None:
    with pytest.raises(ValueError, match="aware"):
        encode_cancel("t-1", "c-1", datetime(2026, 11, 29))


@pytest.mark.parametrize(
    ("task_id", "client_id", "field"),
    [("t 1", "c-1", "task_id"), ("", "c-1", "task_id"), ("t-1", "x" * 129, "client_id")],
)
def test_encode_refuses_an_id_outside_the_pattern_without_quoting_it(
    task_id: str, client_id: str, field: str
) -> None:
    with pytest.raises(ValueError, match=f"{field}: string_pattern_mismatch") as caught:
        encode_cancel(task_id, client_id, MOMENT)
    assert "t 1" not in str(caught.value)


# ------------------------------------------------------------------------------- decoding


def test_decode_gives_the_fields_and_the_moment() -> None:
    request = decode_cancel(_body(reason="the user asked"))
    assert (request.task_id, request.client_id) == ("t-0001", "client-a")
    assert request.requested_at == MOMENT
    assert request.requested_at.utcoffset() == timedelta(0)
    with pytest.raises(ValueError, match="frozen"):
        request.task_id = "t-2"  # type: ignore[misc]


def test_a_body_at_the_limit_decodes_and_one_byte_more_is_too_large() -> None:
    bare = _body(padding="")
    at_limit = _body(padding="x" * (MAX_CANCEL_BYTES - len(bare)))
    assert len(at_limit) == MAX_CANCEL_BYTES == 65_536
    assert decode_cancel(at_limit).task_id == "t-0001"
    error = _refusal(at_limit + b" ")
    assert error.reason == CancelDecodeReason.TOO_LARGE
    assert error.task_id is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\xff", CancelDecodeReason.INVALID_UTF8),
        (b"\xef\xbb\xbf" + _body(), CancelDecodeReason.INVALID_JSON),
        (_body(extra="PLACEHOLDER").replace(b'"PLACEHOLDER"', b"NaN"), "invalid_json"),
        (b'"cancel"', CancelDecodeReason.NOT_AN_OBJECT),
        (_body(extra="X").replace(b'"X"', b"[" * 64 + b"]" * 64), CancelDecodeReason.TOO_DEEP),
        (_body(extra="X").replace(b'"X"', b"[" * 5000 + b"]" * 5000), "too_deep"),
    ],
    ids=["invalid-utf8", "bom", "nan", "string", "depth-65", "depth-5000"],
)
def test_the_reading_checks_come_first(body: bytes, reason: str) -> None:
    assert _refusal(body).reason == reason


def test_the_depth_limit_counts_the_request_as_level_one() -> None:
    assert decode_cancel(_body(extra="X").replace(b'"X"', b"[" * 63 + b"]" * 63))


@pytest.mark.parametrize("version", [2, 0, -1, 10**100])
def test_another_integer_version_is_unsupported_before_the_fields(version: int) -> None:
    error = _refusal(json.dumps({"protocol_version": version, "task_id": "t-9"}).encode())
    assert error.reason == CancelDecodeReason.UNSUPPORTED_VERSION
    assert error.task_id == "t-9"


@pytest.mark.parametrize(
    "changes",
    [
        {"protocol_version": 1.0},
        {"protocol_version": True},
        {"protocol_version": "1"},
        {"type": "Cancel"},
        {"type": "started"},
        {"type": None},
        {"client_id": "client a"},
        {"client_id": None},
        {"timestamp": "2026-11-29T22:48:46Z"},
        {"timestamp": "2026-11-29T22:48:46.123456+00:00"},
        {"timestamp": "2026-13-29T22:48:46.123456Z"},
        {"timestamp": "2026-11-29T24:48:46.123456Z"},
        {"timestamp": "٢٠٢٦-11-29T22:48:46.123456Z"},
        {"timestamp": "2026-11-29T22:48:46.123456Z\n"},
        {"timestamp": 1_795_992_526},
    ],
    ids=lambda changes: "-".join(f"{key}={value!r}" for key, value in changes.items()),
)
def test_a_field_outside_its_rule_is_invalid_cancel_and_keeps_the_task_id(
    changes: dict[str, Any],
) -> None:
    error = _refusal(_body(**changes))
    assert error.reason == CancelDecodeReason.INVALID_CANCEL
    assert error.task_id == "t-0001"
    assert next(iter(changes)) in error.detail


@pytest.mark.parametrize("missing", ["protocol_version", "type", "task_id", "client_id"])
def test_every_field_is_required(missing: str) -> None:
    document = json.loads(_body())
    del document[missing]
    error = _refusal(json.dumps(document).encode())
    assert error.reason == CancelDecodeReason.INVALID_CANCEL
    assert f"{missing}: missing" in error.detail


def test_the_reasons_are_the_documented_set() -> None:
    assert {reason.value for reason in CancelDecodeReason} == {
        "too_large",
        "invalid_utf8",
        "invalid_json",
        "not_an_object",
        "too_deep",
        "unsupported_version",
        "invalid_cancel",
    }
    assert issubclass(CancelDecodeError, ProtocolError)


# ------------------------------------------------------------------------------- the code


def test_task_cancelled_is_a_reserved_sdk_code_with_a_description() -> None:
    assert ErrorCode.TASK_CANCELLED.value == "TASK_CANCELLED"
    assert "TASK_CANCELLED" in RESERVED_ERROR_CODES
    assert "cancelled" in ErrorCode.TASK_CANCELLED.description
    with pytest.raises(ValueError, match="reserved"):
        FatalError("TASK_CANCELLED", "a handler may not claim it")
