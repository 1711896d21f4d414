"""The operator's commands without a broker: their usage errors, inspect's answer and its view.

The broker's side (real workers answering, a frozen one named, purge, reports) is in
tests/integration/test_operator_commands.py.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

import pytest

from async_task_api_worker.cli import main
from async_task_api_worker.cli.commands.inspect_view import Inspected, render_json, render_table
from async_task_api_worker.protocol.inspect import (
    InspectReply,
    consumer_tag,
    decode_inspect_reply,
    encode_inspect_request,
)
from async_task_api_worker.runtime.exit_codes import ExitCode
from async_task_api_worker.runtime.inspection import Inspection


def _reply(
    host: str, pid: int, tasks: list[tuple[str, int, float]], tag: bool = True
) -> InspectReply:
    answer = Inspection("svc", 4, lambda: tasks, monotonic=lambda: 10.0).answer
    request = encode_inspect_request("r-1", "cli", datetime.now(UTC))
    body = answer(request, consumer_tag(host, pid, "n") if tag else None)
    assert body is not None
    return decode_inspect_reply(body).model_copy(update={"host": host, "pid": pid})


def test_a_worker_answers_with_what_it_runs_and_refuses_what_is_not_a_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inspection = Inspection(
        "svc", 4, lambda: [("t-1", 2, 1.5)], monotonic=iter([0.0, 2.5]).__next__
    )
    body = inspection.answer(encode_inspect_request("r-9", "ops", datetime.now(UTC)), "atw/h/1/n")
    assert body is not None
    reply = decode_inspect_reply(body)
    assert (reply.request_id, reply.service, reply.concurrency, reply.uptime_s) == (
        "r-9",
        "svc",
        4,
        2.5,
    )
    assert [(t.task_id, t.attempt, t.elapsed_s) for t in reply.tasks] == [("t-1", 2, 1.5)]
    assert reply.consumer_tag == "atw/h/1/n"
    with caplog.at_level(logging.WARNING):
        assert inspection.answer(b'{"type":"inspect","secret":"SECRET-1"}', None) is None
    assert "An inspect request was refused" in caplog.text and "SECRET-1" not in caplog.text


def test_the_table_groups_workers_by_host_and_names_the_silent_one() -> None:
    found = Inspected(service="svc", queue="svc_queue_in", timeout_s=2.0, consumers=4)
    found.replies = [_reply("b", 7, []), _reply("a", 2, [("t-1", 1, 3.25)]), _reply("a", 1, [])]
    found.tags = [
        consumer_tag(host, pid, "n") for host, pid in (("a", 1), ("a", 2), ("b", 7), ("c", 9))
    ]
    assert (found.missing, found.all_answered) == (1, False)
    lines = render_table(found).splitlines()
    assert lines[0] == (
        "service svc: 3 worker process(es) answered within 2 s; svc_queue_in has 4 consumer(s)"
    )
    assert lines[1].split() == ["HOST", "PID", "SDK", "CONCURRENCY", "UPTIME", "RUNNING"]
    assert lines[2].split()[:2] == ["a", "1"]
    assert lines[3].split()[:1] == ["2"]  # the same host, not repeated
    assert lines[4].split() == ["task", "t-1", "attempt", "1", "elapsed", "3.2", "s"]
    assert lines[5].split()[:2] == ["b", "7"]
    assert lines[6] == "NOT ANSWERING: host c pid 9 (tag atw/c/9/n)"
    document = json.loads(render_json(found))
    assert document["not_answering"] == [{"consumer_tag": "atw/c/9/n", "host": "c", "pid": 9}]
    assert (document["not_answering_count"], len(document["answered"])) == (1, 3)


def test_without_the_tags_the_count_says_how_many_did_not_answer() -> None:
    found = Inspected(service="svc", queue="q", timeout_s=1.0, consumers=2, tags_missing="why")
    found.replies = [_reply("a", 1, [])]
    assert (found.missing, found.all_answered) == (1, False)
    last = render_table(found).splitlines()[-1]
    assert last.startswith("NOT ANSWERING: 1 consumer(s) of q; they cannot be named without ")
    assert "consumer tags (why)" in last
    assert json.loads(render_json(found))["not_answering"] is None
    found.replies.append(_reply("a", 2, []))
    assert found.all_answered
    # A worker that consumes nothing now (draining) answers, but is not one of the consumers.
    found.replies = [_reply("a", 1, []), _reply("a", 3, [], tag=False)]
    assert found.missing == 1
    assert "(not consuming)" in render_table(found)


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["inspect", "--service", "bad name"], "--service 'bad name' does not match"),
        (["inspect", "--service", "s", "--timeout-s", "0"], "--timeout-s must be a positive"),
        (["inspect", "--service", "s", "--timeout-s", "nan"], "--timeout-s must be a positive"),
        (["purge", "--service", "s"], "purge asks before it deletes: run it on a terminal"),
    ],
)
def test_a_usage_error_is_one_line_and_exits_2(
    arguments: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # pytest's stdin is not a terminal: purge without --yes refuses before connecting.
    assert main(arguments) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err


def test_a_listing_from_another_broker_is_not_trusted() -> None:
    # rabbitmqctl on PATH may speak to another broker than --broker-url's: its listing of the
    # queue's consumers then differs from the count this broker gave, and names nobody.
    found = Inspected(service="svc", queue="q", timeout_s=1.0, consumers=2, tags=[])
    found.replies = [_reply("a", 1, [])]
    assert (found.silent_tags, found.missing) == (None, 1)
    assert "rabbitmqctl listed 0 consumer(s) of q where the broker counted 2" in render_table(found)
    assert "is it this broker's" in json.loads(render_json(found))["not_named_because"]
