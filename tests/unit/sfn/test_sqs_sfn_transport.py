"""The SQS + Step Functions transport and its codec, on recording AWS clients (no moto)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from async_task_api_worker import RetryableError, TaskContext, Worker
from async_task_api_worker.engine import Engine
from async_task_api_worker.engine.decision import Reason
from async_task_api_worker.errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    EnvelopeDecodeError,
    MessageTooLargeError,
    PublishError,
    ReportRefusedError,
    SettleError,
)
from async_task_api_worker.executors import InlineExecutor
from async_task_api_worker.protocol.reports import (
    FailureReport,
    ReportError,
    SuccessReport,
    encode_report,
)
from async_task_api_worker.runtime import Runner
from async_task_api_worker.runtime.hooks import FINISH_MARGIN_S, drain_grace_s, shutdown_bound_s
from async_task_api_worker.settings import load_settings
from async_task_api_worker.sfn.protection import TaskProtection
from async_task_api_worker.transports.memory import InMemoryTransport
from async_task_api_worker.transports.sqs_sfn import GIVEN_BACK_ERROR, SqsSfnTransport
from async_task_api_worker.transports.sqs_sfn.aws import (
    QueueRefusedError,
    StepFunctionsApi,
    make_clients,
)
from async_task_api_worker.transports.sqs_sfn.codec import (
    MAX_CAUSE_CHARS,
    MAX_ERROR_CHARS,
    MAX_OUTPUT_BYTES,
    failure_of,
    output_of,
    read_body,
)
from async_task_api_worker.transports.sqs_sfn.tokens import SfnDelivery
from tests.conftest import decision_records
from tests.unit.sfn.test_sfn_parts import stubbed

QUEUE = "https://sqs.example/123456789012/svc"


class FakeAws:
    """SQS (one queue) and Step Functions at once, recording every call."""

    def __init__(self, bodies: list[str] | None = None) -> None:
        self.ready = [
            {"MessageId": f"m-{n}", "ReceiptHandle": f"r-{n}", "Body": body}
            for n, body in enumerate(bodies or [])
        ]
        self.calls: list[tuple[str, Any]] = []
        self.receives = 0
        self.fail_next: dict[str, str] = {}
        self.queue_error: Exception | None = None

    def _maybe_fail(self, operation: str) -> None:
        code = self.fail_next.pop(operation, None)
        if code is not None:
            raise ClientError({"Error": {"Code": code, "Message": code}}, operation)

    def get_queue_attributes(self, **arguments: Any) -> dict[str, Any]:
        if self.queue_error is not None:
            raise self.queue_error
        return {"Attributes": {}}

    def receive_message(
        self,
        QueueUrl: str,
        MaxNumberOfMessages: int,
        WaitTimeSeconds: int,
        MessageAttributeNames: list[str],
    ) -> Any:
        assert MessageAttributeNames == ["traceparent", "tracestate"]
        self.receives += 1
        taken, self.ready = self.ready[:MaxNumberOfMessages], self.ready[MaxNumberOfMessages:]
        self.calls.append(("receive", MaxNumberOfMessages))
        return {"Messages": taken}

    def delete_message(self, QueueUrl: str, ReceiptHandle: str) -> None:
        self.calls.append(("delete", ReceiptHandle))

    def change_message_visibility(self, **arguments: Any) -> None:
        self.calls.append(("visible", arguments["ReceiptHandle"]))

    def send_task_heartbeat(self, taskToken: str) -> None:
        self._maybe_fail("send_task_heartbeat")
        self.calls.append(("heartbeat", taskToken))

    def send_task_success(self, taskToken: str, output: str) -> None:
        self._maybe_fail("send_task_success")
        self.calls.append(("success", (taskToken, output)))

    def send_task_failure(self, taskToken: str, error: str, cause: str) -> None:
        self._maybe_fail("send_task_failure")
        self.calls.append(("failure", (taskToken, error, cause)))

    def sent(self, kind: str) -> list[Any]:
        return [value for name, value in self.calls if name == kind]


class Agent(TaskProtection):
    def __init__(self) -> None:
        super().__init__("http://agent.invalid")
        self.states: list[bool] = []

    def enable(self, expires_in_minutes: int) -> bool:
        self.states.append(True)
        return True

    def disable(self) -> bool:
        self.states.append(False)
        return True


def transport_on(aws: FakeAws, **options: Any) -> SqsSfnTransport:
    arguments: dict[str, Any] = {
        "queue_url": QUEUE,
        "service": "svc",
        "prefetch": 1,
        "heartbeat_interval_s": 30.0,
        "protection_minutes": 2,
        "wait_time_s": 0,
        "sqs_client": aws,
        "stepfunctions_client": aws,
        "protection": TaskProtection(""),
    }
    arguments.update(options)
    return SqsSfnTransport(**arguments)


def token_body(token: str = "t-1", **fields: Any) -> str:  # noqa: S107 - a test token
    return json.dumps({"task_token": token, **fields})


# ---------------------------------------------------------------------------- the codec

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(fields=st.dictionaries(st.text(max_size=8), json_values, max_size=5), keep=st.booleans())
def test_the_token_is_taken_out_and_the_rest_is_the_input(
    fields: dict[str, Any], keep: bool
) -> None:
    document = {**fields, "task_token": "tok"}
    read = read_body(
        json.dumps(document).encode(),
        message_id="m-1",
        service="svc",
        keep_token=keep,
        max_body_bytes=1 << 20,
    )
    assert read.token == "tok" and read.envelope is not None
    expected = document if keep else {k: v for k, v in document.items() if k != "task_token"}
    assert read.envelope.input == expected
    assert (read.envelope.task_id, read.envelope.client_id) == ("m-1", "step-functions")


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=200) | st.text(max_size=50).map(str.encode))
def test_any_body_is_read_without_raising(body: bytes) -> None:
    read = read_body(body, message_id="m-1", service="svc", keep_token=False, max_body_bytes=100)
    assert (read.envelope is None) == (read.error is not None)
    if read.token is None:
        assert read.error is not None and read.error.task_id is None
        assert "no task token to report to" in str(read.error)


@pytest.mark.parametrize(
    "body",
    [
        b'{"task_token": ""}',
        b'{"task_token": "   "}',
        b'{"task_token": 7}',
        b'["task_token"]',
        b"not json",
        b'{"task_token": "t", "x": NaN}',
    ],
)
def test_a_body_without_a_usable_token_has_nobody_to_tell(body: bytes) -> None:
    read = read_body(body, message_id="m", service="svc", keep_token=False, max_body_bytes=1000)
    assert read.token is None or read.error is not None
    if read.token is None:
        assert read.error is not None and read.error.task_id is None


def test_a_deep_body_with_a_token_is_refused_and_reported() -> None:
    body = json.dumps({"task_token": "t", "deep": json.loads("[" * 70 + "]" * 70)}).encode()
    read = read_body(body, message_id="m", service="svc", keep_token=False, max_body_bytes=10**6)
    assert read.token == "t" and read.error is not None
    assert (read.error.reason, read.error.task_id) == ("too_deep", "m")


def success(response: dict[str, Any]) -> Any:
    report = SuccessReport.model_construct(
        protocol_version=1,
        task_id="t",
        client_id="c",
        service="svc",
        attempt=1,
        timestamp="2026-12-01T00:00:00.000000Z",
        response=response,
    )
    return encode_report(report)


def failure(code: str, message: str) -> Any:
    report = FailureReport.model_construct(
        protocol_version=1,
        task_id="t",
        client_id="c",
        service="svc",
        attempt=1,
        timestamp="2026-12-01T00:00:00.000000Z",
        error=ReportError.model_construct(code=code, message=message),
    )
    return encode_report(report)


def test_the_output_is_measured_in_utf8_bytes_against_256_kib() -> None:
    room = MAX_OUTPUT_BYTES - len(b'{"x":""}')
    assert len(output_of(success({"x": "a" * room})).encode()) == MAX_OUTPUT_BYTES
    with pytest.raises(MessageTooLargeError):
        output_of(success({"x": "a" * (room + 1)}))
    with pytest.raises(MessageTooLargeError):  # 2 bytes a character in UTF-8
        output_of(success({"x": "é" * (room // 2 + 1)}))


def test_error_and_cause_are_bounded_and_named_by_the_face() -> None:
    error, cause = failure_of(failure("TASK_TIMEOUT", "m" * 1024), {"TASK_TIMEOUT": "E" * 300})
    assert (len(error), len(cause)) == (MAX_ERROR_CHARS, 1024)
    assert failure_of(failure("MY_CODE", "why"), {}) == ("MY_CODE", "why")
    assert MAX_CAUSE_CHARS == 32768


# ---------------------------------------------------------------------------- the transport


async def take(transport: SqsSfnTransport, count: int) -> list[SfnDelivery]:
    taken: list[SfnDelivery] = []
    async for delivery in transport.deliveries():
        taken.append(delivery)
        if len(taken) == count:
            break
    return taken


async def test_nothing_is_received_while_every_slot_is_taken() -> None:
    aws = FakeAws([token_body("a"), token_body("b")])
    agent = Agent()
    transport = transport_on(aws, protection=agent)
    await transport.connect()
    (first,) = await take(transport, 1)
    assert aws.calls[:2] == [("receive", 1), ("delete", "r-0")]
    assert agent.states == [True]  # protected before the delete
    receiving = asyncio.ensure_future(take(transport, 1))
    await asyncio.sleep(0.05)
    assert aws.receives == 1 and not receiving.done()  # the one slot is in hand
    await first.release()
    (second,) = await asyncio.wait_for(receiving, 5)
    assert second.token == "b"
    await second.release()
    assert agent.states == [True, False, True, False]
    await transport.close()


async def test_a_message_received_after_the_stop_is_handed_back_not_deleted() -> None:
    aws = FakeAws([token_body("a")])
    transport = transport_on(aws)
    await transport.connect()
    await transport.stop_consuming()
    assert await take(transport, 1) == []
    assert aws.sent("delete") == []

    aws.ready = [{"MessageId": "m", "ReceiptHandle": "r-late", "Body": token_body()}]
    transport = transport_on(aws)
    await transport.connect()
    original = aws.receive_message
    loop = asyncio.get_running_loop()

    def stop_while_polling(**arguments: Any) -> Any:
        # The stop lands during the long poll: it runs on the loop before the poll's answer.
        asyncio.run_coroutine_threadsafe(transport.stop_consuming(), loop)
        return original(**arguments)

    aws.receive_message = stop_while_polling  # type: ignore[method-assign]
    assert await take(transport, 1) == []
    await transport.close()  # the hand-back runs beside; close waits for it
    assert aws.sent("visible") == ["r-late"] and aws.sent("delete") == []


async def test_a_give_back_ends_the_token_with_task_given_back() -> None:
    aws = FakeAws([token_body("a")])
    transport = transport_on(aws)
    await transport.connect()
    (delivery,) = await take(transport, 1)
    await delivery.give_back()
    ((token, error, cause),) = aws.sent("failure")
    assert (token, error) == ("a", GIVEN_BACK_ERROR) and "not the task's failure" in cause
    aws.fail_next["send_task_failure"] = "TaskTimedOut"
    await delivery.give_back()  # stale already: nothing to do
    aws.fail_next["send_task_failure"] = "ThrottlingException"
    with pytest.raises(SettleError):
        await delivery.give_back()
    # It left SQS at pickup: no requeue, ack or reject to fake (the engine asks for none).
    assert not delivery.requeueable
    for settle in (delivery.retry(), delivery.ack(), delivery.reject()):
        with pytest.raises(SettleError):
            await settle
    assert len(aws.sent("failure")) == 1
    await delivery.release()
    await transport.close()


async def test_a_stale_token_on_a_report_withdraws_the_delivery() -> None:
    aws = FakeAws([token_body("a")])
    transport = transport_on(aws)
    await transport.connect()
    (delivery,) = await take(transport, 1)
    aws.fail_next["send_task_success"] = "InvalidToken"
    with pytest.raises(Exception, match="stale"):
        await delivery.report(success({"ok": True}))
    assert delivery.cancel_token.reason == "stale task token"
    await delivery.release()
    await transport.close()


async def test_a_refused_queue_is_a_configuration_error_and_a_lost_one_is_retried() -> None:
    aws = FakeAws()
    aws.queue_error = ClientError(
        {"Error": {"Code": "AWS.SimpleQueueService.NonExistentQueue", "Message": "x"}}, "Get"
    )
    with pytest.raises(BrokerRefusedError, match="NonExistentQueue"):
        await transport_on(aws).connect()
    aws.queue_error = EndpointConnectionError(endpoint_url=QUEUE)
    with pytest.raises(BrokerUnavailableError):
        await transport_on(aws, connect_timeout_s=0.01).connect()


async def test_a_refused_body_carries_its_decode_error_for_the_engine() -> None:
    aws = FakeAws(["{not json"])
    transport = transport_on(aws)
    await transport.connect()
    (delivery,) = await take(transport, 1)
    assert isinstance(delivery.envelope, EnvelopeDecodeError)
    assert "no task token to report to" in str(delivery.envelope)
    await delivery.release()
    assert aws.sent("failure") == [] and aws.sent("heartbeat") == []
    await transport.close()


# ---------------------------------------------------------------------------- the engine on it


class Flaky(BaseModel):
    pass


class Done(BaseModel):
    ok: bool = True


def flaky_worker() -> Worker:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Flaky, ctx: TaskContext) -> Done:
        raise RetryableError("BUSY", "try later")

    return worker


async def test_each_delivery_is_its_tasks_one_attempt_so_a_retry_concludes(
    decisions: Any,
) -> None:
    aws = FakeAws([token_body("a")])
    transport = transport_on(aws)
    await transport.connect()
    (delivery,) = await take(transport, 1)
    settings_ = load_settings({"worker_delivery_limit": 5}, read_environment=False)
    engine = Engine(flaky_worker(), settings_, transport, InlineExecutor())
    settled = await engine.handle(delivery)
    assert (settled.outcome.value, settled.code, settled.attempt, settled.delivery_limit) == (
        "failure",
        "BUSY",
        1,
        1,
    )
    assert aws.sent("failure") == [("a", "BUSY", "try later")]
    assert aws.sent("heartbeat") == ["a"]  # `started`
    (line,) = decision_records(decisions)
    assert line.getMessage().endswith("attempt=1/1")
    await transport.close()


def sleeping_worker(entered: asyncio.Event) -> Worker:
    worker = Worker("svc")

    @worker.task(timeout=20)
    async def handle(task_input: Flaky, ctx: TaskContext) -> Done:
        entered.set()
        await asyncio.sleep(0.3)
        return Done()

    return worker


async def test_the_drain_finishes_a_task_that_cannot_be_given_back() -> None:
    on_rabbitmq = load_settings({"worker_shutdown_grace_s": 0}, read_environment=False)
    settings_ = load_settings(
        {"worker_shutdown_grace_s": 0, "worker_transport": "sqs-sfn", "sqs_queue_url": QUEUE},
        read_environment=False,
    )
    assert drain_grace_s(settings_, 20) == 20 + FINISH_MARGIN_S
    assert drain_grace_s(on_rabbitmq, 20) == 0
    entered = asyncio.Event()
    transport = InMemoryTransport()  # the grace is the face's: the memory broker stands in
    transport.put(
        b'{"protocol_version":1,"task_id":"t","client_id":"c","service":"svc","input":{}}'
    )
    runner = Runner(sleeping_worker(entered), settings_, transport)
    assert runner.grace_s == 20 + FINISH_MARGIN_S
    # on SQS, the close also waits out a long poll (SQS_WAIT_TIME_S)
    assert shutdown_bound_s(settings_, grace_s=runner.grace_s) == 30 + 5 + 5 + 5 + 2 + 5
    serving = asyncio.ensure_future(runner.serve())
    await asyncio.wait_for(entered.wait(), 5)
    runner.request_shutdown("test")
    assert await asyncio.wait_for(serving, 10) == 0
    assert [p.report.type for p in transport.published][-1] == "success"
    assert transport.acked and not transport.unacked_count


async def test_the_stale_line_is_at_the_faces_level(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="async_task_api_worker")
    aws = FakeAws([token_body("a")])
    transport = transport_on(aws, heartbeat_interval_s=0.01, stale_log_level=logging.INFO)
    aws.fail_next["send_task_heartbeat"] = "TaskTimedOut"
    await transport.connect()
    (delivery,) = await take(transport, 1)
    done = asyncio.Event()
    delivery.cancel_token.add_callback(done.set)
    await asyncio.wait_for(done.wait(), 5)
    (line,) = [r for r in caplog.records if "went stale" in r.getMessage()]
    assert line.levelno == logging.INFO and "TaskTimedOut" in line.getMessage()
    await delivery.release()
    await transport.close()


async def test_a_failing_receive_is_not_ready_backs_off_and_a_stop_ends_the_wait() -> None:
    aws = FakeAws()
    failed = asyncio.Event()
    loop = asyncio.get_running_loop()

    def unreachable(**arguments: Any) -> Any:
        aws.receives += 1
        loop.call_soon_threadsafe(failed.set)
        raise EndpointConnectionError(endpoint_url=QUEUE)

    aws.receive_message = unreachable  # type: ignore[method-assign]
    warned = asyncio.Event()

    class Signal(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "trying again" in record.getMessage():
                warned.set()

    signal_handler = Signal()
    logging.getLogger("async_task_api_worker.transports.sqs_sfn").addHandler(signal_handler)
    transport = transport_on(aws)
    await transport.connect()
    assert transport.consuming and transport.holding
    polling = asyncio.ensure_future(take(transport, 1))
    try:
        await asyncio.wait_for(warned.wait(), 5)  # the failed receive, said once
    finally:
        logging.getLogger("async_task_api_worker.transports.sqs_sfn").removeHandler(signal_handler)
    assert failed.is_set()
    assert not transport.consuming  # /ready says `broker`
    assert not transport.holding  # and the task processes' leases are not renewed
    await transport.stop_consuming()
    assert await asyncio.wait_for(polling, 5) == []
    assert aws.receives == 1  # no second try: the stop cut the backoff short
    await transport.close()


async def test_without_a_long_poll_an_empty_queue_is_not_asked_again_at_once() -> None:
    aws = FakeAws()
    asked = asyncio.Event()
    loop = asyncio.get_running_loop()
    original = aws.receive_message

    def counted(**arguments: Any) -> Any:
        loop.call_soon_threadsafe(asked.set)
        return original(**arguments)

    aws.receive_message = counted  # type: ignore[method-assign]
    transport = transport_on(aws, wait_time_s=0)
    await transport.connect()
    polling = asyncio.ensure_future(take(transport, 1))
    await asyncio.wait_for(asked.wait(), 5)
    for _ in range(20):  # give a spinning loop every chance to ask again
        await asyncio.sleep(0)
    await transport.stop_consuming()
    assert await asyncio.wait_for(polling, 5) == []
    assert aws.receives == 1
    await transport.close()


# ---------------------------------------------------------------------------- found by breaking


@pytest.mark.parametrize(
    "body",
    [
        b'{"task_token": "tok", "ratio": NaN}',
        b'\xef\xbb\xbf{"task_token": "tok"}',
        b'{"task_token": "tok", "n": ' + b"9" * 5000 + b"}",
        b'{"task_token": "tok", "deep": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"task_token": "tok", "big": "' + b"a" * 5000 + b'"}',
    ],
)
def test_a_body_the_strict_reader_refuses_still_ends_its_token(body: bytes) -> None:
    read = read_body(body, message_id="m-7", service="svc", keep_token=False, max_body_bytes=4000)
    assert read.token == "tok" and read.envelope is None
    assert read.error is not None and read.error.task_id == "m-7"  # reported: POISON_MESSAGE


def test_a_refused_body_without_a_token_names_its_sqs_message() -> None:
    read = read_body(b"{x", message_id="m-8", service="svc", keep_token=False, max_body_bytes=99)
    assert read.token is None and "(SQS message m-8)" in str(read.error)


async def test_a_queue_sqs_refuses_for_good_stops_the_poll() -> None:
    aws = FakeAws()
    transport = transport_on(aws)
    await transport.connect()

    def gone(**arguments: Any) -> Any:
        raise ClientError(
            {"Error": {"Code": "AWS.SimpleQueueService.NonExistentQueue", "Message": "x"}},
            "ReceiveMessage",
        )

    aws.receive_message = gone  # type: ignore[method-assign]
    with pytest.raises(QueueRefusedError, match="NonExistentQueue"):
        await take(transport, 1)
    await transport.close()


async def test_deletes_refused_for_good_hand_the_message_back_and_stop() -> None:
    aws = FakeAws([token_body("a")])
    agent = Agent()
    transport = transport_on(aws, protection=agent)
    await transport.connect()

    def denied(**arguments: Any) -> None:
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "x"}}, "DeleteMessage")

    aws.delete_message = denied  # type: ignore[method-assign]
    with pytest.raises(QueueRefusedError, match="AccessDenied"):
        await take(transport, 1)
    assert aws.sent("visible") == ["r-0"]
    assert agent.states == [True, False]
    await transport.close()


async def test_a_delete_that_failed_is_tried_again_and_its_copy_is_not_run_twice() -> None:
    aws = FakeAws([token_body("a")])
    transport = transport_on(aws, prefetch=2)
    await transport.connect()
    aws.delete_message = lambda **arguments: (_ for _ in ()).throw(  # type: ignore[method-assign]
        ClientError({"Error": {"Code": "InternalError", "Message": "x"}}, "DeleteMessage")
    )
    (delivery,) = await take(transport, 1)
    assert delivery.deleted is False
    del aws.delete_message  # SQS takes deletes again
    # SQS brings the message back (its visibility timeout ran out): the same token.
    copy = {"MessageId": "m-0", "ReceiptHandle": "r-again", "Body": token_body("a")}
    assert await transport.pick_up(copy) is None
    assert aws.sent("delete") == ["r-again"]
    await delivery.release()
    assert aws.sent("delete") == ["r-again", "r-0"]  # tried again at release
    await transport.close()


def slow_deletes(aws: FakeAws) -> tuple[asyncio.Event, asyncio.Event]:
    """Make every delete hang until released: (set when a delete starts, the release)."""
    deleting, release_delete = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    original = aws.delete_message

    def slow_delete(**arguments: Any) -> None:
        loop.call_soon_threadsafe(deleting.set)
        asyncio.run_coroutine_threadsafe(release_delete.wait(), loop).result(5)
        original(**arguments)

    aws.delete_message = slow_delete  # type: ignore[method-assign]
    return deleting, release_delete


async def test_a_stop_during_pickup_hands_the_task_back_to_step_functions() -> None:
    aws = FakeAws([token_body("a"), token_body("b")])
    transport = transport_on(aws, prefetch=2)
    await transport.connect()
    deleting, release_delete = slow_deletes(aws)
    loop = asyncio.get_running_loop()
    handed_back = asyncio.Event()
    failing = aws.send_task_failure

    def recorded_failure(**arguments: Any) -> None:
        failing(**arguments)
        loop.call_soon_threadsafe(handed_back.set)

    aws.send_task_failure = recorded_failure  # type: ignore[method-assign]
    consumer = asyncio.ensure_future(take(transport, 2))
    await asyncio.wait_for(deleting.wait(), 5)
    consumer.cancel()  # the runner's drain cancels its consumer mid-pickup
    with pytest.raises(asyncio.CancelledError):
        await consumer
    # The token goes back at once, while the delete still hangs: a slow delete cannot
    # outlast the close and take the give-back with it.
    await asyncio.wait_for(handed_back.wait(), 5)
    release_delete.set()
    await transport.close()  # waits for what the stop left behind
    assert [(token, error) for token, error, _ in aws.sent("failure")] == [("a", GIVEN_BACK_ERROR)]
    assert aws.sent("visible") == ["r-1"]  # the rest of the batch, back to the queue


async def test_a_stop_during_pickup_returns_the_delivery_for_the_engines_give_back(
    decisions: Any,
) -> None:
    aws = FakeAws([token_body("a"), token_body("b")])
    transport = transport_on(aws, prefetch=2)
    await transport.connect()
    deleting, release_delete = slow_deletes(aws)
    consumer = asyncio.ensure_future(take(transport, 2))
    await asyncio.wait_for(deleting.wait(), 5)
    stopping = asyncio.ensure_future(transport.stop_consuming())
    await asyncio.sleep(0)  # one turn: the stop takes the pickup in flight
    release_delete.set()
    (left,) = await asyncio.wait_for(stopping, 5)  # once picked up: its delete went through
    assert left.token == "a" and left.deleted
    assert await asyncio.wait_for(consumer, 5) == []  # the stop took it: not handed out
    engine = Engine(
        flaky_worker(), load_settings({}, read_environment=False), transport, InlineExecutor()
    )
    settled = await engine.give_back(left, Reason.NEVER_STARTED)
    assert (settled.outcome.value, settled.reason) == ("shutdown_requeued", "never_started")
    (line,) = decision_records(decisions)
    assert line.getMessage().endswith("attempt=1/1 reason=never_started")
    await transport.close()
    assert [(token, error) for token, error, _ in aws.sent("failure")] == [("a", GIVEN_BACK_ERROR)]
    assert aws.sent("visible") == ["r-1"]  # the rest of the batch, back to the queue


def test_a_call_refused_for_good_is_not_held() -> None:
    client, stubber = stubbed()
    stubber.add_client_error(
        "send_task_success", service_error_code="ValidationException", http_status_code=400
    )
    stubber.add_client_error(
        "send_task_failure", service_error_code="AccessDeniedException", http_status_code=400
    )
    stubber.add_client_error(
        "send_task_heartbeat", service_error_code="ValidationException", http_status_code=400
    )
    api = StepFunctionsApi(client)
    with stubber:
        with pytest.raises(ReportRefusedError, match="ValidationException"):
            api.succeed("t", "{}")
        with pytest.raises(ReportRefusedError, match="AccessDeniedException"):
            api.fail("t", "E", "c")
        with pytest.raises(PublishError) as raised:  # a beat is only ever tried again
            api.heartbeat("t")
    assert not isinstance(raised.value, ReportRefusedError)


def test_the_region_comes_from_the_queue_url_when_none_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    sqs, sfn = make_clients(queue_url="https://sqs.eu-west-1.amazonaws.com/1/q")
    assert (sqs.meta.region_name, sfn.meta.region_name) == ("eu-west-1", "eu-west-1")
    with pytest.raises(BrokerRefusedError, match="no AWS region"):
        make_clients(queue_url="http://127.0.0.1:9/1/q")
