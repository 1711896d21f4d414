"""JSON log lines: fields, task fields from any logger and thread, redaction, set-up rules."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from async_task_api_worker import SyncTaskContext, TaskContext, Worker
from async_task_api_worker.context import bind_task_fields
from async_task_api_worker.observability.logging import (
    JsonFormatter,
    TaskContextFilter,
    configure_logging,
    redact_secrets,
)
from async_task_api_worker.testing import WorkerHarness

LOGGERS = ("async_task_api_worker", "aio_pika", "aiormq", "aio_pika.tools")


@pytest.fixture
def bare_root() -> Iterator[logging.Logger]:
    """The root logger with no handler (as in a fresh process), restored afterwards.

    pytest adds its capture handlers to the root logger when the test's call starts, after
    the fixtures: each test clears them with :func:`clear` first.
    """
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved = {
        name: (logging.getLogger(name).level, logging.getLogger(name).filters[:])
        for name in LOGGERS
    }
    root.handlers.clear()
    yield root
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)
    for name, (level, filters) in saved.items():
        logging.getLogger(name).setLevel(level)
        logging.getLogger(name).filters[:] = filters


def clear(root: logging.Logger) -> logging.Logger:
    root.handlers.clear()
    return root


def record(msg: str = "hello %s", *args: object, **extra: Any) -> logging.LogRecord:
    made = logging.LogRecord("some.lib", logging.INFO, "f.py", 1, msg, args or ("world",), None)
    for name, value in extra.items():
        setattr(made, name, value)
    return made


def test_a_record_is_one_json_line_with_the_required_fields() -> None:
    line = JsonFormatter().format(record("multi\nline %s"))
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["level"] == "INFO"
    assert parsed["logger"] == "some.lib"
    assert parsed["msg"] == "multi\nline world"
    assert parsed["ts"].endswith("Z") and "T" in parsed["ts"]
    assert "task_id" not in parsed


def test_extra_fields_are_kept_none_dropped_and_objects_stringified() -> None:
    parsed = json.loads(
        JsonFormatter().format(
            record(task_id="t-1", attempt=2, outcome="success", code=None, thing=object)
        )
    )
    assert parsed["task_id"] == "t-1"
    assert parsed["attempt"] == 2
    assert parsed["outcome"] == "success"
    assert "code" not in parsed
    assert parsed["thing"] == str(object)


def test_a_traceback_is_formatted_and_redacted() -> None:
    try:
        raise ConnectionError("amqp://svc:s3cr3t@rabbit:5672/ refused")
    except ConnectionError:
        import sys

        made = logging.LogRecord("x", logging.ERROR, "f.py", 1, "failed", None, sys.exc_info())
    parsed = json.loads(JsonFormatter().format(made))
    assert "ConnectionError" in parsed["exc"]
    assert "s3cr3t" not in parsed["exc"]
    assert "amqp://svc:***@rabbit" in parsed["exc"]


def test_url_passwords_are_redacted_in_messages() -> None:
    line = JsonFormatter().format(record("connecting to %s", "amqps://user:pa:ss@host/vhost"))
    assert "pa:ss" not in line
    assert "amqps://user:***@host/vhost" in line


@given(
    password=st.text(
        # White space ends a URL in free text (every kind Python's str.isspace knows, the
        # Ogham space mark included), so a password cannot hold any.
        alphabet=st.characters(blacklist_characters="@/").filter(lambda c: not c.isspace()),
        min_size=6,
    ),
    scheme=st.sampled_from(["amqp", "amqps", "redis", "postgresql+psycopg"]),
)
def test_no_password_survives_redaction(password: str, scheme: str) -> None:
    text = f"url={scheme}://user:{password}@host:5672/v and more"
    redacted = redact_secrets(text)
    assert password not in redacted.replace(f"{scheme}://user:***@host:5672/v and more", "")
    assert redacted.startswith(f"url={scheme}://user:***@host")


def test_text_without_urls_is_unchanged() -> None:
    assert redact_secrets("user:pass@host without a scheme") == "user:pass@host without a scheme"


def test_the_filter_adds_the_bound_task_fields_and_keeps_explicit_ones() -> None:
    task_filter = TaskContextFilter()
    unbound = record()
    assert task_filter.filter(unbound)
    assert not hasattr(unbound, "task_id")
    with bind_task_fields({"task_id": "t-9", "service": "svc", "attempt": 3}):
        bound = record()
        task_filter.filter(bound)
        explicit = record(task_id="other")
        task_filter.filter(explicit)
    assert (bound.task_id, bound.service, bound.attempt) == ("t-9", "svc", 3)  # type: ignore[attr-defined]
    assert explicit.task_id == "other"  # type: ignore[attr-defined]


def test_the_filter_works_in_a_record_factory_as_the_readme_shows() -> None:
    task_fields = TaskContextFilter()
    previous_factory = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        made = previous_factory(*args, **kwargs)
        task_fields.filter(made)
        return made

    logging.setLogRecordFactory(factory)
    try:
        with bind_task_fields({"task_id": "t-f", "service": "svc", "attempt": 1}):
            made = logging.getLogger("app").makeRecord("app", logging.INFO, "f", 1, "m", (), None)
    finally:
        logging.setLogRecordFactory(previous_factory)
    assert made.task_id == "t-f"  # type: ignore[attr-defined]


def test_configure_adds_one_json_handler_and_not_twice(bare_root: logging.Logger) -> None:
    clear(bare_root)
    stream = io.StringIO()
    assert configure_logging("DEBUG", stream=stream) is True
    assert configure_logging("DEBUG", stream=stream) is False
    assert len(bare_root.handlers) == 1
    logging.getLogger("some.lib").debug("once")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["msg"] == "once"


def test_configure_sets_the_level(bare_root: logging.Logger) -> None:
    clear(bare_root)
    stream = io.StringIO()
    configure_logging("WARNING", stream=stream)
    logging.getLogger("async_task_api_worker.engine").info("hidden")
    logging.getLogger("some.lib").info("hidden too")
    logging.getLogger("async_task_api_worker.engine").warning("shown")
    assert [json.loads(line)["msg"] for line in stream.getvalue().splitlines()] == ["shown"]


def test_an_application_root_logger_is_left_alone(bare_root: logging.Logger) -> None:
    clear(bare_root)
    theirs = io.StringIO()
    handler = logging.StreamHandler(theirs)
    handler.setFormatter(logging.Formatter("APP %(name)s %(message)s"))
    bare_root.addHandler(handler)
    bare_root.setLevel(logging.INFO)
    assert configure_logging("INFO") is False
    assert bare_root.handlers == [handler]
    logging.getLogger("aio_pika.tools").error("Callback error")
    assert theirs.getvalue() == "APP aio_pika.tools Callback error\n"
    assert logging.getLogger("aio_pika.tools").filters == []


def test_aio_pika_callback_errors_become_warnings(bare_root: logging.Logger) -> None:
    clear(bare_root)
    stream = io.StringIO()
    configure_logging("INFO", stream=stream)
    logging.getLogger("aio_pika.tools").error("Callback %r error: %s", "cb", "closed")
    logging.getLogger("aio_pika.robust_connection").info("reconnecting (INFO is muted)")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["level"], line["logger"]) for line in lines] == [("WARNING", "aio_pika.tools")]


class Text(BaseModel):
    text: str


class Out(BaseModel):
    ok: bool = True


def test_library_records_in_async_def_and_thread_handlers_carry_the_task_fields(
    bare_root: logging.Logger,
) -> None:
    clear(bare_root)
    stream = io.StringIO()
    configure_logging("INFO", stream=stream)
    async_worker = Worker("svc")

    @async_worker.task(timeout=5)
    async def handle(task_input: Text, ctx: TaskContext) -> Out:
        logging.getLogger("some.lib").info("async %s", task_input.text)
        await asyncio.to_thread(logging.getLogger("some.lib").info, "to_thread")
        ctx.logger.info("ctx")
        return Out()

    sync_worker = Worker("svc")

    @sync_worker.task(timeout=5)
    def handle_sync(task_input: Text, ctx: SyncTaskContext) -> Out:
        assert threading.current_thread() is not threading.main_thread()
        logging.getLogger("some.lib").info("thread")
        return Out()

    async def scenario() -> None:
        async with WorkerHarness(async_worker) as harness:
            await harness.submit({"text": "x"}, task_id="t-async")
        async with WorkerHarness(sync_worker) as harness:
            await harness.submit({"text": "x"}, task_id="t-sync")

    asyncio.run(scenario())
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    by_msg = {line["msg"]: line for line in lines}
    for msg, task_id in (
        ("async x", "t-async"),
        ("to_thread", "t-async"),
        ("ctx", "t-async"),
        ("thread", "t-sync"),
    ):
        assert by_msg[msg]["task_id"] == task_id, msg
        assert by_msg[msg]["service"] == "svc"
        assert by_msg[msg]["attempt"] == 1
    decision = [line for line in lines if line["msg"].startswith("Delivery settled")]
    assert {line["task_id"] for line in decision} == {"t-async", "t-sync"}
    assert all(line["outcome"] == "success" for line in decision)


def test_the_record_factory_recipe_and_ctx_logger_work_together() -> None:
    task_fields = TaskContextFilter()
    previous_factory = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        made = previous_factory(*args, **kwargs)
        task_fields.filter(made)
        return made

    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Text, ctx: TaskContext) -> Out:
        ctx.logger.info("through ctx.logger", extra={"attempt": 7, "step": "one"})
        logging.getLogger("some.lib").info("through a library")
        return Out()

    async def scenario() -> None:
        async with WorkerHarness(worker) as harness:
            run = await harness.submit({"text": "x"}, task_id="t-factory")
            run.assert_succeeded()

    keep = Keep()
    root = logging.getLogger()
    level = root.level
    root.addHandler(keep)
    root.setLevel(logging.INFO)
    logging.setLogRecordFactory(factory)
    try:
        asyncio.run(scenario())
    finally:
        logging.setLogRecordFactory(previous_factory)
        root.removeHandler(keep)
        root.setLevel(level)
    by_msg = {record.getMessage(): record for record in seen}
    for msg in ("through ctx.logger", "through a library"):
        assert by_msg[msg].task_id == "t-factory"  # type: ignore[attr-defined]
    assert by_msg["through ctx.logger"].step == "one"  # type: ignore[attr-defined]


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("str boom SECRET")


def test_the_formatter_never_raises_and_never_leaks_arguments() -> None:
    formatter = JsonFormatter()
    mismatched = record("%s %s", "amqp://u:MISMATCH@h/")
    mismatched.args = ("amqp://u:MISMATCH@h/",)
    line = json.loads(formatter.format(mismatched))
    assert "MISMATCH" not in json.dumps(line)
    assert "could not be formatted" in line["msg"]
    odd = json.loads(
        formatter.format(
            record(
                "%s",
                "\ud800 lone",
                obj=Unprintable(),
                big=10**5000,
                nan=float("nan"),
                url="amqp://u:EXTRASECRET@h/",
            )
        )
    )
    assert odd["msg"] == "\ud800 lone"
    assert "SECRET" not in json.dumps(odd)
    assert odd["obj"].startswith("(unprintable Unprintable")
    assert odd["big"].startswith("(an integer of")
    assert odd["nan"] == "nan"
    assert odd["url"] == "amqp://u:***@h/"
    long = json.loads(formatter.format(record("%s", "x" * 200_000)))
    assert len(long["msg"]) < 70_000 and long["msg"].endswith("more characters)")


def test_a_line_that_cannot_be_written_is_reported_without_its_content(
    bare_root: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    clear(bare_root)

    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError("disk full")

    configure_logging("INFO", stream=Broken())
    logging.getLogger("some.lib").info("amqp://u:LEAK@h/ payload")
    err = capsys.readouterr().err
    assert "LEAK" not in err and "payload" not in err
    assert "could not be written (OSError)" in err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("amqp://user:p@ss@host/v", "amqp://user:***@host/v"),
        ("amqp://user:pa/ss@host", "amqp://user:***@host"),
        ("url_amqp://u:p@h x", "url_amqp://u:***@h x"),
        ('{"a":"amqp://u:s\\"c@h"}', '{"a":"amqp://u:***@h"}'),
        ("a amqp://u:p@h/v b redis://:pw@r:6379", "a amqp://u:***@h/v b redis://:***@r:6379"),
        ("amqps://[::1]:5672/ http://host:80/p", "amqps://[::1]:5672/ http://host:80/p"),
    ],
)
def test_redaction_covers_odd_passwords(text: str, expected: str) -> None:
    assert redact_secrets(text) == expected
