"""Properties of the envelope decoder (docs/protocol.md, "Decoding and poison messages").

Whatever the bytes, ``decode_envelope`` returns an :class:`Envelope` or raises
:class:`EnvelopeDecodeError` with a reason from the fixed set; its message never echoes the
body; and the task id is recovered exactly when the body is an object with a valid one.
"""

from __future__ import annotations

import json
import re
import traceback
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from async_task_api_worker.errors import EnvelopeDecodeError
from async_task_api_worker.protocol import ID_PATTERN, Envelope, PoisonReason, decode_envelope
from tests.unit.protocol.protocol_strategies import (
    ids,
    json_objects,
    json_values,
    service_names,
    texts,
    timestamps,
)

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REASONS = {reason.value for reason in PoisonReason}
CANARY = "SECRET-CANARY-1234"
_ID_RE = re.compile(ID_PATTERN)


def _decode(body: bytes, **options: Any) -> Envelope | EnvelopeDecodeError:
    """Decode; any exception other than EnvelopeDecodeError escapes and fails the test."""
    try:
        return decode_envelope(body, **options)
    except EnvelopeDecodeError as exc:
        error = exc
    assert error.reason in REASONS
    assert isinstance(error.reason, str)
    return error


def _expected_id(document: Any, key: str) -> str | None:
    if isinstance(document, dict):
        value = document.get(key)
        if isinstance(value, str) and _ID_RE.fullmatch(value):
            return value
    return None


def _body(document: Any, *, ascii_only: bool) -> bytes:
    """JSON text of ``document`` (lone surrogates as escapes either way)."""
    text = json.dumps(document, ensure_ascii=True, separators=(",", ":"))
    if not ascii_only:
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
        text = re.sub("[\ud800-\udfff]", lambda match: f"\\u{ord(match.group()):04x}", text)
    return text.encode("utf-8")


# ------------------------------------------------------------------------------ strategies


@st.composite
def valid_documents(draw: st.DrawFn) -> dict[str, Any]:
    document: dict[str, Any] = {
        "protocol_version": 1,
        "task_id": draw(ids),
        "client_id": draw(ids),
        "service": draw(service_names),
        "input": draw(json_objects()),
    }
    if draw(st.booleans()):
        document["input_refs"] = [
            {"name": draw(st.text(min_size=1, max_size=8)), "uri": "s3://b/k"}
            for _ in range(draw(st.integers(0, 3)))
        ]
    if draw(st.booleans()):
        document["created_at"] = draw(timestamps)
    return document


_FIELDS = [
    "protocol_version",
    "task_id",
    "client_id",
    "service",
    "input",
    "input_refs",
    "created_at",
    "unknown",
]
_replacements = st.one_of(
    json_values(),
    ids,
    texts,
    st.integers(min_value=-3, max_value=3),
    st.sampled_from([True, False, None, 1.0, "1", [], {}, "2026-11-29T22:48:46+01:00"]),
)


@st.composite
def near_valid_documents(draw: st.DrawFn) -> dict[str, Any]:
    document = draw(valid_documents())
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(_FIELDS))
        if draw(st.booleans()):
            document.pop(field, None)
        else:
            document[field] = draw(_replacements)
    return document


def _mutated(body: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    data = bytearray(body)
    for kind, position, byte in edits:
        index = position % (len(data) + 1)
        if kind == 0:
            data.insert(index, byte)
        elif kind == 1 and index < len(data):
            del data[index]
        elif index < len(data):
            data[index] = byte
    return bytes(data)


_edits = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 10_000), st.integers(0, 255)), max_size=4
)


# ------------------------------------------------------------------------------ properties


@FAST
@given(st.binary(max_size=300))
def test_arbitrary_bytes_give_an_envelope_or_a_poison_reason(body: bytes) -> None:
    _decode(body)


@FAST
@given(valid_documents(), _edits)
def test_bytes_near_a_valid_body_give_an_envelope_or_a_poison_reason(
    document: dict[str, Any], edits: list[tuple[int, int, int]]
) -> None:
    _decode(_mutated(_body(document, ascii_only=False), edits))


@FAST
@given(json_values(), st.booleans())
def test_arbitrary_json_documents_recover_ids_iff_valid(document: Any, ascii_only: bool) -> None:
    outcome = _decode(_body(document, ascii_only=ascii_only))
    if isinstance(outcome, EnvelopeDecodeError):
        assert outcome.task_id == _expected_id(document, "task_id")
        assert outcome.client_id == _expected_id(document, "client_id")
        if not isinstance(document, dict):
            assert outcome.reason == PoisonReason.NOT_AN_OBJECT


@FAST
@given(valid_documents(), st.booleans())
def test_valid_documents_decode_to_their_fields(document: dict[str, Any], ascii_only: bool) -> None:
    envelope = decode_envelope(_body(document, ascii_only=ascii_only))
    assert envelope.task_id == document["task_id"]
    assert envelope.client_id == document["client_id"]
    assert envelope.service == document["service"]
    assert len(envelope.input_refs) == len(document.get("input_refs", []))


@FAST
@given(near_valid_documents(), st.booleans())
def test_mutated_envelopes_recover_ids_iff_valid(
    document: dict[str, Any], ascii_only: bool
) -> None:
    outcome = _decode(_body(document, ascii_only=ascii_only))
    if isinstance(outcome, EnvelopeDecodeError):
        assert outcome.task_id == _expected_id(document, "task_id")
        assert outcome.client_id == _expected_id(document, "client_id")
        version = document.get("protocol_version")
        if type(version) is int and version != 1:
            assert outcome.reason == PoisonReason.UNSUPPORTED_VERSION
    else:
        assert outcome.task_id == document["task_id"]
        assert type(document["protocol_version"]) is int


# ------------------------------------------------------------------------------ no echo

_PLACES = [
    ("task_id",),
    ("client_id",),
    ("service",),
    ("protocol_version",),
    ("input",),
    ("input", "note"),
    ("input_refs",),
    ("input_refs", 0, "name"),
    ("input_refs", 0, "uri"),
    ("input_refs", 0, "content_type"),
    ("input_refs", 0, "size_bytes"),
    ("input_refs", 0, "sha256"),
    ("created_at",),
    ("unknown",),
]


def _breakages(body: bytes) -> list[tuple[bytes, int]]:
    """The same body broken in each way that leads to a distinct poison reason."""
    deep = b'{"task_id":"t-1","x":' + b"[" * 70 + body + b"]" * 70 + b"}"
    return [
        (body, len(body)),
        (body, len(body) - 1),  # too_large
        (body[:-1], len(body)),  # invalid_json (truncated)
        (body + b"\xff", len(body) + 1),  # invalid_utf8
        (body[:-1] + b',"n":NaN}', len(body) + 8),  # invalid_json (NaN)
        (body[:-1] + b',"i":' + b"7" * 5000 + b"}", len(body) + 5005),  # integer too long
        (b"[" + body + b"]", len(body) + 2),  # not_an_object
        (deep, len(deep)),  # too_deep
        (b"[" * 5000 + body + b"]" * 5000, len(body) + 10_000),  # too deep to parse
        (body.replace(b'"protocol_version":1', b'"protocol_version":2'), len(body)),
    ]


def _place(document: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = document
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value


@FAST
@given(
    st.sampled_from(_PLACES),
    st.sampled_from([CANARY, f"x {CANARY} y", f"\u00e9{CANARY}\ud800"]),
    st.booleans(),
)
def test_the_error_never_echoes_the_body(path: tuple[Any, ...], canary: str, as_key: bool) -> None:
    document: dict[str, Any] = {
        "protocol_version": 1,
        "task_id": "t-1",
        "client_id": "c-1",
        "service": "svc",
        "input": {"note": "n"},
        "input_refs": [{"name": "a", "uri": "s3://b/k"}],
    }
    if as_key:
        _place(document, path, {canary: canary})
        document[canary] = 1
    else:
        _place(document, path, canary)
    body = _body(document, ascii_only=False)
    refused = 0
    for broken, limit in _breakages(body):
        outcome = _decode(broken, max_body_bytes=limit)
        if isinstance(outcome, Envelope):
            continue
        refused += 1
        # No chained parser or pydantic error: theirs hold the body (JSONDecodeError.doc, the
        # ValidationError's input values) and would be printed with a traceback.
        assert outcome.__cause__ is None
        assert outcome.__context__ is None or outcome.__suppress_context__
        rendered = "".join(traceback.format_exception(outcome))
        for text in (str(outcome), outcome.detail, repr(outcome.args), rendered):
            assert CANARY not in text
    assert refused >= len(_breakages(body)) - 1


@FAST
@given(st.binary(max_size=64), st.binary(max_size=64))
def test_the_error_never_echoes_arbitrary_bytes_around_a_canary(
    before: bytes, after: bytes
) -> None:
    outcome = _decode(before + CANARY.encode() + after)
    assert isinstance(outcome, EnvelopeDecodeError)
    assert CANARY not in "".join(traceback.format_exception(outcome))
