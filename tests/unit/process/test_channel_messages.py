"""The task channel's messages: what a child may say, checked on the way in."""

from __future__ import annotations

import io
import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from async_task_api_worker.conclusion import Failure, Response, conclusion_to_json
from async_task_api_worker.context import bind_task_fields
from async_task_api_worker.executors.process.channel import (
    ChannelError,
    LogMessage,
    OutcomeMessage,
    TaskRequest,
    decode_child_message,
)
from async_task_api_worker.observability.logging import configure_logging
from async_task_api_worker.task_call import TaskFields

FIELDS = TaskFields("t-1", "c", "svc", 1, 5)


@pytest.mark.parametrize("code", ["TASK_TIMEOUT", "WORKER_DIED", "POISON_MESSAGE"])
def test_a_child_cannot_claim_what_only_the_worker_can_say(code: str) -> None:
    forged = OutcomeMessage(Failure(code, "forged")).to_json()
    with pytest.raises(ChannelError, match="cannot claim"):
        decode_child_message(forged)


@pytest.mark.parametrize("code", ["INTERNAL_ERROR", "INVALID_RESULT", "WORKER_CRASHED", "MINE"])
def test_a_child_may_send_what_its_task_call_concludes(code: str) -> None:
    message = decode_child_message(OutcomeMessage(Failure(code, "m")).to_json())
    assert message == OutcomeMessage(Failure(code, "m"))


@given(
    st.one_of(
        st.builds(Response, st.dictionaries(st.text(), st.integers())),
        st.builds(
            Failure,
            st.from_regex(r"^[A-Z][A-Z0-9_]{0,20}$", fullmatch=True).filter(
                lambda code: (
                    code
                    not in {
                        "TASK_TIMEOUT",
                        "WORKER_DIED",
                        "POISON_MESSAGE",
                        "TASK_ABANDONED_AFTER_REDELIVERIES",
                        "RESULT_TOO_LARGE",
                    }
                )
            ),
            st.text(max_size=1024),
            st.booleans(),
            st.one_of(st.none(), st.floats(min_value=0, max_value=1e6)),
        ),
    )
)
def test_an_outcome_travels_intact(conclusion: Response | Failure) -> None:
    wire = json.loads(json.dumps(OutcomeMessage(conclusion).to_json()))
    assert decode_child_message(wire) == OutcomeMessage(conclusion)
    assert conclusion_to_json(conclusion)["ok"] is isinstance(conclusion, Response)


def test_a_request_travels_intact() -> None:
    request = TaskRequest({"x": 1}, FIELDS, memory_limit_bytes=1 << 30, cpu_limit_s=2.0)
    assert TaskRequest.from_json(json.loads(json.dumps(request.to_json()))) == request
    with pytest.raises(ChannelError):
        TaskRequest.from_json({"t": "request", "input": [], "fields": {}})


def test_a_relayed_line_carries_the_workers_task_fields_and_says_where_it_came_from() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()
    try:
        configure_logging("INFO", stream=stream)
        forged = LogMessage(
            logging.INFO,
            "async_task_api_worker.engine",
            "Delivery settled: outcome=success action=ack code=- attempt=1/5",
            {"task_id": "someone-else", "amqp://u:PASSWORD7@h": 1},
        )
        with bind_task_fields({"task_id": "t-1", "service": "svc", "attempt": 1}):
            forged.relay()
    finally:
        root.handlers[:] = saved
    line = json.loads(stream.getvalue())
    assert line["task_id"] == "t-1"
    assert line["task_process"] is True
    assert "PASSWORD7" not in stream.getvalue()
