"""Properties of the cancel request codec (docs/protocol.md, "Cancelling a task").

Whatever the bytes, ``decode_cancel`` returns a :class:`CancelRequest` or raises
:class:`CancelDecodeError` with a reason from the fixed set, whose message never echoes the
body; ``encode_cancel`` gives bytes that decode back to what was encoded.
"""

from __future__ import annotations

import json
import re
import traceback
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from async_task_api_worker.errors import CancelDecodeError
from async_task_api_worker.protocol import (
    ID_PATTERN,
    CancelDecodeReason,
    CancelRequest,
    canonical_dumps,
    decode_cancel,
    encode_cancel,
    format_timestamp,
)
from tests.unit.protocol.protocol_strategies import ids, json_values, texts, timestamps

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REASONS = {reason.value for reason in CancelDecodeReason}
FIELDS = ("protocol_version", "type", "task_id", "client_id", "timestamp")
CANARY = "SECRET-CANARY-1234"
_ID_RE = re.compile(ID_PATTERN)


def _decode(body: bytes) -> CancelRequest | CancelDecodeError:
    """Decode; any exception other than CancelDecodeError escapes and fails the test."""
    try:
        return decode_cancel(body)
    except CancelDecodeError as exc:
        error = exc
    assert error.reason in REASONS
    assert str(error) == f"{error.reason}: {error.detail}"
    assert error.__cause__ is None, "the parser's exception (which holds the body) is dropped"
    return error


def _valid(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "protocol_version": 1,
        "type": "cancel",
        "task_id": "t-0001",
        "client_id": "client-a",
        "timestamp": "2026-11-29T22:48:46.123456Z",
    }
    document.update(changes)
    return document


#: Moments in any fixed offset, to the microsecond, within years the timestamp can write.
moments = st.builds(
    lambda moment, minutes: moment.replace(tzinfo=timezone(timedelta(minutes=minutes))),
    st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9999, 12, 30)),
    st.integers(min_value=-23 * 60, max_value=23 * 60),
)

#: A value for one of the request's fields: right, wrong type, or merely close.
field_values = st.one_of(
    ids,
    timestamps,
    st.sampled_from([1, 2, 0, -1, 1.0, True, None, "1", "cancel", "Cancel", "started", ""]),
    texts,
    json_values(),
)


@st.composite
def near_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A valid request with some fields changed, dropped, or joined by unknown ones."""
    document = _valid(task_id=draw(ids), client_id=draw(ids), timestamp=draw(timestamps))
    for name in draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=3)):
        if draw(st.booleans()):
            del document[name]
        else:
            document[name] = draw(field_values)
    extra = draw(st.dictionaries(texts, json_values(), max_size=3))
    return {**extra, **document}


# ------------------------------------------------------------------------------ properties


@FAST
@given(st.binary(max_size=512))
def test_any_bytes_decode_or_raise_cancel_decode_error(body: bytes) -> None:
    _decode(body)


@FAST
@given(json_values())
def test_any_json_value_decodes_or_raises_cancel_decode_error(value: Any) -> None:
    outcome = _decode(canonical_dumps(value))
    if not isinstance(value, dict):
        assert isinstance(outcome, CancelDecodeError)
        assert outcome.reason == CancelDecodeReason.NOT_AN_OBJECT
        assert outcome.task_id is None


@FAST
@given(near_documents())
def test_a_near_request_decodes_exactly_when_its_fields_are_valid(document: dict[str, Any]) -> None:
    outcome = _decode(canonical_dumps(document))
    valid = (
        type(document.get("protocol_version")) is int
        and document["protocol_version"] == 1
        and document.get("type") == "cancel"
        and all(
            isinstance(document.get(key), str) and _ID_RE.fullmatch(document[key])
            for key in ("task_id", "client_id")
        )
        and isinstance(document.get("timestamp"), str)
        and re.fullmatch(
            r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z",
            document["timestamp"],
        )
        is not None
    )
    if valid:
        assert isinstance(outcome, CancelRequest)
        assert outcome.model_dump() == {name: document[name] for name in FIELDS}
        return
    assert isinstance(outcome, CancelDecodeError)
    task_id = document.get("task_id")
    expected_id = task_id if isinstance(task_id, str) and _ID_RE.fullmatch(task_id) else None
    assert outcome.task_id == expected_id


@FAST
@given(ids, ids, moments)
def test_encode_then_decode_gives_back_the_request(
    task_id: str, client_id: str, moment: datetime
) -> None:
    body, properties = encode_cancel(task_id, client_id, moment)
    request = decode_cancel(body)
    assert (request.task_id, request.client_id) == (task_id, client_id)
    assert request.requested_at == moment
    assert request.timestamp == format_timestamp(moment)
    # Canonical: encoding the decoded request again gives the same bytes.
    assert encode_cancel(request.task_id, request.client_id, request.requested_at)[0] == body
    assert properties.message_id == f"{task_id}/cancel"
    assert properties.correlation_id == task_id
    assert properties.app_id == client_id
    assert properties.timestamp_s == int(moment.astimezone(UTC).timestamp() // 1)


@FAST
@given(ids, ids, timestamps, st.dictionaries(texts, json_values(), max_size=4))
def test_unknown_fields_change_nothing(
    task_id: str, client_id: str, timestamp: str, extra: dict[str, Any]
) -> None:
    document = _valid(task_id=task_id, client_id=client_id, timestamp=timestamp)
    body = canonical_dumps({**extra, **document})
    assert decode_cancel(body) == decode_cancel(canonical_dumps(document))


@FAST
@given(st.sampled_from([*FIELDS, "unknown"]), st.sampled_from(["value", "key"]))
def test_a_refusal_never_quotes_the_body(where: str, part: str) -> None:
    document = _valid()
    if part == "value":
        document[where] = f"{CANARY} {where}"
    else:
        document[f"{CANARY}-{where}"] = document.pop(where, 1)
    outcome = _decode(json.dumps(document).encode())
    if isinstance(outcome, CancelDecodeError):
        assert CANARY not in str(outcome)
        assert CANARY not in "".join(traceback.format_exception(outcome))
