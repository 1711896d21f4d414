"""Properties of the inspect request and reply codec (docs/protocol.md, "Inspecting workers").

Whatever the bytes, the decoders return their model or raise ``ProtocolError`` (never echoing
the body); the encoders give bytes that decode back to what was encoded; an inspect request is
refused by the cancel decoder (``invalid_cancel``), as any foreign control message is, by a
worker that does not know it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from async_task_api_worker.errors import CancelDecodeError, ProtocolError
from async_task_api_worker.protocol.cancel import decode_cancel
from async_task_api_worker.protocol.encoding import canonical_dumps
from async_task_api_worker.protocol.inspect import (
    InspectReply,
    InspectRequest,
    consumer_tag,
    decode_inspect_reply,
    decode_inspect_request,
    encode_inspect_reply,
    encode_inspect_request,
    tag_owner,
)
from async_task_api_worker.protocol.reports import format_timestamp
from tests.unit.protocol.protocol_strategies import ids, json_values, texts

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CANARY = "SECRET-CANARY-1234"
moments = st.datetimes(
    min_value=datetime(1970, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
)
tasks = st.lists(
    st.tuples(
        ids,
        st.integers(min_value=1, max_value=1000),
        st.floats(min_value=0, max_value=1e6, allow_nan=False),
    ),
    max_size=5,
)


@FAST
@given(ids, ids, moments)
def test_a_request_decodes_back_to_what_was_encoded(
    request_id: str, client_id: str, moment: datetime
) -> None:
    body = encode_inspect_request(request_id, client_id, moment)
    request = decode_inspect_request(body)
    assert (request.request_id, request.client_id) == (request_id, client_id)
    assert request.timestamp == format_timestamp(moment)
    assert canonical_dumps(request.model_dump()) == body


@FAST
@given(ids, ids, moments)
def test_an_older_worker_refuses_a_request_as_a_foreign_cancel(
    request_id: str, client_id: str, moment: datetime
) -> None:
    # A worker that reads every control message as a cancel: dropped, no task touched.
    with pytest.raises(CancelDecodeError) as refused:
        decode_cancel(encode_inspect_request(request_id, client_id, moment))
    assert refused.value.reason == "invalid_cancel"
    assert refused.value.task_id is None


@FAST
@given(st.binary(max_size=512))
def test_any_bytes_decode_to_a_request_or_a_protocol_error(body: bytes) -> None:
    for decode in (decode_inspect_request, decode_inspect_reply):
        error: ProtocolError | None = None
        try:
            decode(body)
        except ProtocolError as exc:
            error = exc
        assert error is None or error.__cause__ is None  # nothing else escapes


@FAST
@given(st.dictionaries(texts, json_values(), max_size=5))
def test_a_refused_body_is_never_echoed(document: dict[str, Any]) -> None:
    document = {**document, "request_id": CANARY + "/", "client_id": CANARY, "type": CANARY}
    body = canonical_dumps(document)
    for decode in (decode_inspect_request, decode_inspect_reply):
        with pytest.raises(ProtocolError) as refused:
            decode(body)
        assert CANARY not in str(refused.value)


def _request() -> InspectRequest:
    return decode_inspect_request(encode_inspect_request("r-1", "cli", datetime.now(UTC)))


@FAST
@given(
    st.text(max_size=40),
    st.integers(min_value=1, max_value=2**31),
    st.integers(min_value=1, max_value=10_000),
    st.floats(min_value=0, max_value=1e9, allow_nan=False),
    st.none() | st.text(max_size=60),
    tasks,
)
def test_a_reply_decodes_back_to_what_was_encoded(  # noqa: PLR0917 - hypothesis gives them
    host: str,
    pid: int,
    concurrency: int,
    uptime_s: float,
    tag: str | None,
    running: list[tuple[str, int, float]],
) -> None:
    body = encode_inspect_reply(
        _request(),
        service="svc",
        host=host,
        pid=pid,
        sdk="async-task-api-worker 0.1.0",
        concurrency=concurrency,
        uptime_s=uptime_s,
        consumer_tag=tag,
        tasks=running,
    )
    reply = decode_inspect_reply(body)
    assert isinstance(reply, InspectReply)
    assert (reply.request_id, reply.host, reply.pid, reply.consumer_tag) == ("r-1", host, pid, tag)
    assert reply.uptime_s == round(uptime_s, 3)
    assert sorted((t.task_id, t.attempt) for t in reply.tasks) == sorted(
        (task_id, attempt) for task_id, attempt, _ in running
    )
    assert reply.tasks_left_out == 0


def test_a_reply_lists_the_longest_running_tasks_first_up_to_its_limit() -> None:
    running = [(f"t-{n}", 1, float(n)) for n in range(1003)]
    reply = decode_inspect_reply(
        encode_inspect_reply(
            _request(),
            service="svc",
            host="h",
            pid=1,
            sdk="x",
            concurrency=1003,
            uptime_s=1,
            consumer_tag=None,
            tasks=running,
        )
    )
    assert [task.task_id for task in reply.tasks[:2]] == ["t-1002", "t-1001"]
    assert (len(reply.tasks), reply.tasks_left_out) == (1000, 3)


@FAST
@given(st.text(min_size=1, max_size=300), st.integers(min_value=0, max_value=2**22))
def test_a_consumer_tag_names_its_host_and_pid(host: str, pid: int) -> None:
    tag = consumer_tag(host, pid, "abc123")
    assert len(tag.encode()) <= 255  # AMQP's shortstr: the host is cut at 200 bytes
    named = tag_owner(tag)
    assert named is not None and named[1] == pid and host.startswith(named[0])


@pytest.mark.parametrize(
    "tag", ["ctag1.0a1b", "amq.ctag-xyz", "atw/host/notapid/n", "atw/x", "atw/h/١٢/n", ""]
)
def test_another_programs_tag_names_nobody(tag: str) -> None:
    assert tag_owner(tag) is None
