"""The decoder's limits and refusals, case by case (docs/protocol.md, "Decoding and poison
messages")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from async_task_api_worker.errors import EnvelopeDecodeError
from async_task_api_worker.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_NESTING_DEPTH,
    PoisonReason,
    decode_envelope,
)

VALID: dict[str, Any] = {
    "protocol_version": 1,
    "task_id": "t-1",
    "client_id": "c-1",
    "service": "svc",
    "input": {"width": 640},
}


def body_of(**changes: Any) -> bytes:
    document = {**VALID, **changes}
    return json.dumps(document, separators=(",", ":")).encode()


def refusal(body: bytes, **options: Any) -> EnvelopeDecodeError:
    with pytest.raises(EnvelopeDecodeError) as caught:
        decode_envelope(body, **options)
    return caught.value


def nested(levels: int) -> bytes:
    """A valid envelope whose input makes the whole body ``levels`` deep."""
    inner = b"[" * (levels - 2) + b"]" * (levels - 2)
    return body_of(input={"x": "HOLE"}).replace(b'"HOLE"', inner)


# ----------------------------------------------------------------------- size


def test_a_body_exactly_at_the_limit_is_accepted_one_byte_more_is_too_large() -> None:
    body = body_of()
    assert decode_envelope(body, max_body_bytes=len(body)).task_id == "t-1"
    error = refusal(body, max_body_bytes=len(body) - 1)
    assert error.reason == PoisonReason.TOO_LARGE
    assert (error.task_id, error.client_id) == (None, None)  # refused before parsing
    assert f"{len(body)} bytes exceeds {len(body) - 1} bytes" in str(error)


def test_the_default_limit_is_16_mib() -> None:
    assert DEFAULT_MAX_BODY_BYTES == 16 * 1024 * 1024
    body = body_of()
    padded = body[:-1] + b"," + b'"pad":"' + b"x" * (DEFAULT_MAX_BODY_BYTES - len(body) - 9) + b'"}'
    assert len(padded) == DEFAULT_MAX_BODY_BYTES
    assert decode_envelope(padded).task_id == "t-1"
    assert refusal(padded + b" ").reason == PoisonReason.TOO_LARGE


# ----------------------------------------------------------------------- bytes and JSON


def test_invalid_utf8_is_refused_with_its_offset() -> None:
    body = body_of(input={"x": "HOLE"}).replace(b"HOLE", b"\xc3\x28")
    error = refusal(body)
    assert error.reason == PoisonReason.INVALID_UTF8
    assert error.task_id is None
    offset = body.index(b"\xc3")
    assert f"offset {offset}" in str(error)


def test_a_byte_order_mark_is_invalid_json() -> None:
    assert refusal(b"\xef\xbb\xbf" + body_of()).reason == PoisonReason.INVALID_JSON


def test_truncated_json_is_invalid_json() -> None:
    error = refusal(b'{"a":')
    assert error.reason == PoisonReason.INVALID_JSON
    assert "line 1 column 6" in str(error)


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1E+999"])
def test_nan_and_infinities_are_invalid_json_and_hide_the_task_id(literal: bytes) -> None:
    error = refusal(body_of(input={"x": "HOLE"}).replace(b'"HOLE"', literal))
    assert error.reason == PoisonReason.INVALID_JSON
    assert str(error) == "invalid_json: body is not JSON: a number is NaN or infinite"
    assert error.task_id is None


def test_an_integer_of_5000_digits_is_invalid_json_4300_digits_is_fine() -> None:
    error = refusal(body_of(input={"x": "HOLE"}).replace(b'"HOLE"', b"9" * 5000))
    assert error.reason == PoisonReason.INVALID_JSON
    assert str(error) == "invalid_json: body is not JSON: an integer is too long"
    envelope = decode_envelope(body_of(input={"x": "HOLE"}).replace(b'"HOLE"', b"9" * 4300))
    assert envelope.input["x"] == 10**4300 - 1


def test_a_float_that_underflows_reads_as_zero() -> None:
    envelope = decode_envelope(body_of(input={"x": "HOLE"}).replace(b'"HOLE"', b"1e-400"))
    assert envelope.input["x"] == 0.0


@pytest.mark.parametrize(
    ("body", "kind"),
    [(b"[1,2]", "array"), (b'"x"', "string"), (b"1", "number"), (b"null", "null")],
)
def test_a_json_value_that_is_not_an_object_is_refused(body: bytes, kind: str) -> None:
    error = refusal(body)
    assert error.reason == PoisonReason.NOT_AN_OBJECT
    assert str(error) == f"not_an_object: body is a JSON {kind}, not an object"
    assert error.task_id is None


def test_an_array_holding_a_valid_envelope_is_not_an_object() -> None:
    assert refusal(b"[" + body_of() + b"]").reason == PoisonReason.NOT_AN_OBJECT


def test_duplicate_keys_keep_the_last_value() -> None:
    body = body_of()[:-1] + b',"task_id":"t-2","input":{"k":1,"k":2}}'
    envelope = decode_envelope(body)
    assert envelope.task_id == "t-2"
    assert envelope.input == {"k": 2}


# ----------------------------------------------------------------------- nesting


def test_nesting_at_the_limit_is_accepted() -> None:
    assert MAX_NESTING_DEPTH == 64
    assert decode_envelope(nested(64)).task_id == "t-1"


def test_one_level_over_the_limit_is_too_deep_with_the_ids_recovered() -> None:
    error = refusal(nested(65))
    assert error.reason == PoisonReason.TOO_DEEP
    assert (error.task_id, error.client_id) == ("t-1", "c-1")


def test_10000_levels_are_too_deep_without_exhausting_the_stack() -> None:
    error = refusal(nested(10_000))
    assert error.reason == PoisonReason.TOO_DEEP
    assert error.task_id is None  # the parser gave up: nothing was recovered
    assert str(error) == "too_deep: body nests deeper than 64 levels"


# ----------------------------------------------------------------------- fields


@pytest.mark.parametrize(
    "created_at",
    [
        "2026-11-29T23:48:46+01:00",
        "2026-11-29T21:48:46-01:00",
        "2026-11-29T22:48:46",  # no offset
        "2026-11-29",  # a date
        "2026-11-29T22:48Z",  # no seconds
        "2026-11-29 22:48:46Z",  # space instead of T
        "2026-11-29T22:48:46+0000",  # offset without a colon
        "1795992526",  # seconds, as text
        "",
    ],
)
def test_created_at_must_be_an_rfc3339_utc_timestamp(created_at: str) -> None:
    error = refusal(body_of(created_at=created_at))
    assert error.reason == PoisonReason.INVALID_ENVELOPE
    assert "created_at" in str(error)
    assert (error.task_id, error.client_id) == ("t-1", "c-1")


@pytest.mark.parametrize("created_at", [1795992526, 1795992526.5, True, [], {}])
def test_created_at_must_be_a_string(created_at: object) -> None:
    error = refusal(body_of(created_at=created_at))
    assert error.reason == PoisonReason.INVALID_ENVELOPE
    assert "created_at" in str(error)


@pytest.mark.parametrize(
    ("created_at", "expected"),
    [
        ("2026-11-29T22:48:46Z", "2026-11-29T22:48:46+00:00"),
        ("2026-11-29t22:48:46z", "2026-11-29T22:48:46+00:00"),
        ("2026-11-29T22:48:46.5+00:00", "2026-11-29T22:48:46.500000+00:00"),
        ("2026-11-29T22:48:46.1234567-00:00", "2026-11-29T22:48:46.123456+00:00"),
        (None, None),
    ],
)
def test_created_at_in_utc_is_accepted(created_at: str | None, expected: str | None) -> None:
    envelope = decode_envelope(body_of(created_at=created_at))
    assert (envelope.created_at and envelope.created_at.isoformat()) == expected


@pytest.mark.parametrize(
    ("version", "shown"), [(2, "2"), (0, "0"), (-1, "-1"), (10**30, "10000000000000000000...")]
)
def test_another_integer_version_is_unsupported(version: int, shown: str) -> None:
    error = refusal(body_of(protocol_version=version, input="not even an object"))
    assert error.reason == PoisonReason.UNSUPPORTED_VERSION
    assert (error.task_id, error.client_id) == ("t-1", "c-1")
    assert str(error) == (
        f"unsupported_version: protocol_version {shown} is not supported (this worker speaks 1)"
    )


@pytest.mark.parametrize("version", [True, 1.0, "1", None, [1]])
def test_a_version_that_is_not_an_integer_is_an_invalid_envelope(version: object) -> None:
    error = refusal(body_of(protocol_version=version))
    assert error.reason == PoisonReason.INVALID_ENVELOPE
    assert "protocol_version" in str(error)


def test_a_missing_version_is_an_invalid_envelope() -> None:
    body = body_of().replace(b'"protocol_version":1,', b"")
    error = refusal(body)
    assert error.reason == PoisonReason.INVALID_ENVELOPE
    assert str(error) == "invalid_envelope: invalid envelope: protocol_version: missing"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("task_id", "has space"),
        ("task_id", "-starts-with-dash"),
        ("task_id", "x" * 129),
        ("task_id", "t-1\n"),
        ("task_id", "\u0661"),  # an Arabic-Indic digit is not [0-9]
        ("client_id", ""),
        ("service", "x" * 65),
        ("service", "a:b"),  # ':' and '@' are for ids, not service names
        ("input", []),
        ("input", None),
        ("input_refs", {"name": "a", "uri": "u"}),
        ("input_refs", [{"name": "", "uri": "u"}]),
        ("input_refs", [{"name": "a", "uri": "u", "size_bytes": -1}]),
        ("input_refs", [{"name": "a", "uri": "u", "size_bytes": 1.0}]),
        ("input_refs", [{"name": "a", "uri": "u", "sha256": "E3B0" * 16}]),
        ("input_refs", [{"name": "\ud800", "uri": "u"}]),
        ("input_refs", [{"name": "a", "uri": "u"}] * 257),
    ],
)
def test_field_rules(field: str, value: object) -> None:
    error = refusal(body_of(**{field: value}))
    assert error.reason == PoisonReason.INVALID_ENVELOPE
    assert str(error).startswith(f"invalid_envelope: invalid envelope: {field}")


def test_ids_are_recovered_one_by_one() -> None:
    error = refusal(body_of(task_id="bad id", input=None))
    assert (error.task_id, error.client_id) == (None, "c-1")
    error = refusal(body_of(client_id=7, input=None))
    assert (error.task_id, error.client_id) == ("t-1", None)


def test_limits_of_valid_fields() -> None:
    envelope = decode_envelope(
        body_of(
            task_id="A" + "z" * 127,
            client_id="a.b_c:d@e-f",
            service="s" * 64,
            input={"lone": "\ud800"},
            input_refs=[{"name": "n", "uri": "u", "etag": "ignored"}] * 256,
            future_field={"anything": [1, 2]},
        )
    )
    assert len(envelope.task_id) == 128
    assert len(envelope.input_refs) == 256
    assert envelope.input == {"lone": "\ud800"}
    assert not hasattr(envelope, "future_field")
