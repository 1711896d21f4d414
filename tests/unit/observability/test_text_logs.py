"""LOG_FORMAT=text: one readable line per record with the JSON line's fields; the retry lines."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import sys
from typing import Any

import pytest
from pydantic import BaseModel

from async_task_api_worker import TaskContext, Worker
from async_task_api_worker.observability.logging import (
    JsonFormatter,
    TextFormatter,
    configure_logging,
)
from async_task_api_worker.testing import WorkerHarness
from tests.unit.observability.test_logging import bare_root, clear

__all__ = ["bare_root"]  # the fixture, shared

HEAD = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z) (?P<level>[A-Z]+) +(?P<logger>\S+) "
)
PAIR = re.compile(r' (?P<key>[^ =]+)=(?P<value>"(?:[^"\\]|\\.)*"|[^ "]\S*)(?= |$)')


def parse(line: str, msg: str) -> dict[str, Any]:
    """A text line back into the JSON line's fields (``msg`` known: it is not quoted)."""
    head = HEAD.match(line)
    assert head is not None, line
    fields: dict[str, Any] = dict(head.groupdict())
    rest = line[head.end() :]
    assert rest.startswith(msg), line
    fields["msg"] = msg
    tail = rest[len(msg) :]
    pairs = list(PAIR.finditer(tail))
    assert "".join(pair.group() for pair in pairs) == tail, line  # nothing else on the line
    for pair in pairs:
        value = pair.group("value")
        fields[pair.group("key")] = (
            json.loads(value) if value[0] == '"' or value in ("true", "false") else _scalar(value)
        )
    return fields


def _scalar(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def record(msg: str, *args: object, exc: bool = False, **extra: Any) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ConnectionError("amqp://svc:s3cr3t@rabbit:5672/ refused\nsecond line")
        except ConnectionError:
            exc_info = sys.exc_info()
    made = logging.LogRecord(
        "async_task_api_worker.engine", logging.ERROR, "f.py", 1, msg, args, exc_info
    )
    for name, value in extra.items():
        setattr(made, name, value)
    return made


def test_a_text_line_has_every_field_of_the_json_line() -> None:
    made = record(
        "Task done at %s",
        "amqp://u:pw@h/",
        exc=True,
        task_id="abc",
        service="count words",
        attempt=1,
        outcome="success",
        action="ack",
        code=None,
        settled=True,
        delivery_limit=5,
        ratio=0.5,
        empty="",
        note='a "quoted" b=c',
    )
    as_json = json.loads(JsonFormatter().format(made))
    line = TextFormatter().format(made)
    assert "\n" not in line
    assert line.startswith(f"{as_json['ts']} ERROR async_task_api_worker.engine Task done at ")
    assert parse(line, as_json["msg"]) == as_json
    assert "s3cr3t" not in line and "pw@" not in line  # the same redaction
    assert ' task_id=abc service="count words" attempt=1 outcome=success action=ack ' in line
    assert "code=" not in line  # None is left out, as in JSON


def test_a_field_the_message_says_is_not_said_again_and_the_json_line_keeps_it() -> None:
    made = record(
        "Delivery settled: outcome=%s attempt=%d/%d",
        "retry",
        2,
        5,
        task_id="t",
        outcome="retry",
        attempt=2,
        delivery_limit=5,
        reason="x=y",
    )
    line = TextFormatter().format(made)
    assert line.endswith(' Delivery settled: outcome=retry attempt=2/5 task_id=t reason="x=y"')
    as_json = json.loads(JsonFormatter().format(made))
    assert (as_json["outcome"], as_json["attempt"], as_json["delivery_limit"]) == ("retry", 2, 5)


def test_a_text_line_pads_the_level_as_a_column() -> None:
    made = record("Task done", task_id="abc")
    made.levelno, made.levelname = logging.INFO, "INFO"
    assert re.match(
        r"^\S+Z INFO  async_task_api_worker\.engine Task done task_id=abc$",
        TextFormatter().format(made),
    )


@pytest.mark.parametrize(
    "odd", ["two\nlines", "cr\rlf", "sep\u2028ara\u2029tor", "lone \ud800", "nel\x85"]
)
def test_whatever_a_message_holds_the_record_stays_one_line(odd: str) -> None:
    line = TextFormatter().format(record("%s", odd, extra_field=odd))
    assert len(line.splitlines()) == 1
    line.encode("utf-8")  # writable: no lone surrogate left
    assert parse(line, json.dumps(odd)[1:-1])["extra_field"] == odd


def test_configure_logging_writes_text_lines_at_its_level(bare_root: logging.Logger) -> None:
    clear(bare_root)
    stream = io.StringIO()
    assert configure_logging("INFO", log_format="text", stream=stream)
    logging.getLogger("async_task_api_worker.engine").debug("hidden")
    logging.getLogger("some.lib").warning("shown %d", 1, extra={"k": "v"})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert re.match(r"^\S+Z WARNING some\.lib shown 1 k=v$", lines[0])


class Text(BaseModel):
    text: str


class Out(BaseModel):
    words: int


def test_a_worker_logs_its_decision_lines_and_a_traceback_as_single_text_lines(
    bare_root: logging.Logger,
) -> None:
    clear(bare_root)
    stream = io.StringIO()
    configure_logging("INFO", log_format="text", stream=stream)
    worker = Worker("count-words")

    @worker.task(timeout=5)
    async def handle(task_input: Text, ctx: TaskContext) -> Out:
        if task_input.text == "boom":
            raise RuntimeError("boom\nwith a second line")
        return Out(words=len(task_input.text.split()))

    async def scenario() -> None:
        async with WorkerHarness(worker) as harness:
            await harness.submit({"text": "a b"}, task_id="t-ok")
            await harness.submit({"text": "boom"}, task_id="t-boom")

    asyncio.run(scenario())
    lines = stream.getvalue().splitlines()
    assert all(HEAD.match(line) for line in lines), lines
    decisions = [line for line in lines if "Delivery settled" in line]
    assert len(decisions) == 2
    # Each field once: the message says outcome, action, code and attempt=1/5.
    assert decisions[0].endswith(
        " Delivery settled: outcome=success action=ack code=- attempt=1/5 task_id=t-ok "
        "service=count-words requeue_counted=false settled=true"
    )
    assert " code=INTERNAL_ERROR " in decisions[1]
    raised = [line for line in lines if "Task handler raised RuntimeError" in line]
    assert len(raised) == 1  # the frames, escaped, on the record's one line
    assert "\\n  File " in raised[0] and "task_id=t-boom" in raised[0]
    assert "second line" not in raised[0]  # a handler's message stays out, in text too


# --- one line per connection retry -----------------------------------------------------------


@pytest.mark.parametrize(
    ("logger", "template", "args"),
    [
        ("aiormq.connection", "error when creating transport: %r", (ConnectionError(111),)),
        (
            "aio_pika.robust_connection",
            'Connection attempt to "%s" failed: %s. Reconnecting after %r seconds.',
            ("amqp://u:***@h/", "refused", 1.0),
        ),
    ],
)
@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_the_clients_own_line_per_failed_attempt_shows_at_debug_only(
    bare_root: logging.Logger, logger: str, template: str, args: tuple[object, ...], level: str
) -> None:
    clear(bare_root)
    stream = io.StringIO()
    configure_logging(level, stream=stream)
    client = logging.getLogger(logger)
    (client.error if logger.startswith("aiormq") else client.warning)(template, *args)
    client.error("Unexpected connection close from remote")  # any other line stays a warning
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    expected = [("WARNING", "Unexpected connection close from remote")]
    if level == "DEBUG":
        expected.insert(0, ("DEBUG", template % args))
    assert [(line["level"], line["msg"]) for line in lines] == expected
