"""What the engine reports and how it settles, for each way a task can end."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
from pydantic import BaseModel, Field

from async_task_api_worker import FatalError, RetryableError, SyncTaskContext, TaskContext, Worker
from async_task_api_worker.errors import TimeBudgetError
from async_task_api_worker.ports import Action
from async_task_api_worker.ports import Outcome as EngineOutcome
from async_task_api_worker.testing import Outcome, WorkerHarness
from tests.conftest import decision_records

CANARY = "CANARY-s3cr3t-7f1e"


class Input(BaseModel):
    text: str = Field(min_length=1)
    count: int = 1


class Output(BaseModel):
    echoed: str


def make_worker(behaviour: str, calls: list[str] | None = None) -> Worker:
    """A worker whose async handler does what ``behaviour`` names."""
    worker = Worker("svc")

    @worker.task(timeout=5.0)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        if calls is not None:
            calls.append(ctx.task_id)
        if behaviour == "fatal":
            raise FatalError("NOT_ALLOWED", "This is not allowed.")
        if behaviour == "retry":
            raise RetryableError("UPSTREAM_DOWN", "The upstream is down.")
        if behaviour == "crash":
            raise RuntimeError(f"boom with {CANARY}")
        if behaviour == "bad-code":
            raise FatalError("bad code", "The code has a space.")
        if behaviour == "sleep":
            await asyncio.sleep(30)
        if behaviour == "own-timeout":
            raise TimeoutError("a socket timed out")
        if behaviour == "exit":
            raise SystemExit(3)
        if behaviour == "bad-output":
            return {"unexpected": 1}  # type: ignore[return-value]
        if behaviour == "dict-output":
            return {"echoed": task_input.text}  # type: ignore[return-value]
        if behaviour == "huge-output":
            return Output(echoed="x" * (17 * 1024 * 1024))
        return Output(echoed=task_input.text)

    return worker


async def test_success_publishes_started_then_success_and_acks(
    decisions: pytest.LogCaptureFixture,
) -> None:
    async with WorkerHarness(make_worker("ok")) as harness:
        run = await harness.submit({"text": "hi"}, client_id="client-1", task_id="task-1")
    run.assert_succeeded()
    assert run.message_types == ("started", "success")
    assert run.response == {"echoed": "hi"}
    assert [m.client_id for m in run.messages] == ["client-1", "client-1"]
    assert [m.attempt for m in run.messages] == [1, 1]
    assert run.task_id == "task-1"
    assert harness.transport.acked and not harness.transport.dead_letters
    [line] = decision_records(decisions)
    assert line.getMessage() == "Delivery settled: outcome=success action=ack code=- attempt=1/5"
    assert line.task_id == "task-1"  # type: ignore[attr-defined]


async def test_a_dict_result_is_validated_by_the_output_model() -> None:
    async with WorkerHarness(make_worker("dict-output")) as harness:
        run = await harness.submit({"text": "hi"})
    assert run.response == {"echoed": "hi"}


async def test_fatal_error_concludes_with_its_code(decisions: pytest.LogCaptureFixture) -> None:
    async with WorkerHarness(make_worker("fatal")) as harness:
        run = await harness.submit({"text": "hi"})
    run.assert_failed(code="NOT_ALLOWED")
    assert run.error is not None and run.error.message == "This is not allowed."
    assert run.message_types == ("started", "failure")
    assert run.outcome is Outcome.ACKED
    [line] = decision_records(decisions)
    assert line.getMessage() == (
        "Delivery settled: outcome=failure action=conclude code=NOT_ALLOWED attempt=1/5"
    )
    assert (line.outcome, line.action, line.code, line.delivery_limit) == (  # type: ignore[attr-defined]
        "failure",
        "conclude",
        "NOT_ALLOWED",
        5,
    )


async def test_invalid_input_names_fields_without_echoing_values() -> None:
    calls: list[str] = []
    async with WorkerHarness(make_worker("ok", calls)) as harness:
        run = await harness.submit({"text": "", "count": CANARY})
    run.assert_failed(code="INVALID_INPUT")
    assert run.message_types == ("failure",)  # the task never started
    assert run.error is not None
    assert "text: string_too_short" in run.error.message
    assert "count: int_parsing" in run.error.message
    assert CANARY not in run.error.message
    assert calls == []


async def test_unexpected_exception_is_internal_error_without_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with WorkerHarness(make_worker("crash")) as harness:
        run = await harness.submit({"text": "hi"})
    run.assert_failed(code="INTERNAL_ERROR")
    assert all(CANARY.encode() not in raw for raw in run.raw)
    assert all(CANARY not in record.getMessage() for record in caplog.records)
    assert all(record.exc_info is None for record in caplog.records)
    logged = [r.getMessage() for r in caplog.records if "INTERNAL_ERROR" in r.getMessage()]
    assert logged and "RuntimeError" in logged[0] and "in handle" in logged[0]


async def test_a_code_the_protocol_refuses_is_an_internal_error_that_names_the_rule(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with WorkerHarness(make_worker("bad-code")) as harness:
        run = await harness.submit({"text": "hi"})
    run.assert_failed(code="INTERNAL_ERROR")
    logged = [r.getMessage() for r in caplog.records if "INTERNAL_ERROR" in r.getMessage()]
    assert logged and "error code 'bad code' does not match ^[A-Z][A-Z0-9_]{0,63}$" in logged[0]


async def test_a_timeout_error_raised_by_the_handler_is_not_a_task_timeout() -> None:
    async with WorkerHarness(make_worker("own-timeout")) as harness:
        run = await harness.submit({"text": "hi"})
    run.assert_failed(code="INTERNAL_ERROR")


async def test_sys_exit_in_a_handler_is_an_internal_error_and_the_worker_goes_on() -> None:
    async with WorkerHarness(make_worker("exit")) as harness:
        run = await harness.submit({"text": "hi"})
        run.assert_failed(code="INTERNAL_ERROR")
        again = await harness.submit({"text": "hi"})
        again.assert_failed(code="INTERNAL_ERROR")


async def test_an_async_handler_past_its_timeout_fails_with_task_timeout() -> None:
    overrides = {"worker_task_timeout_s": 0.05}
    async with WorkerHarness(make_worker("sleep"), settings_overrides=overrides) as harness:
        started = time.monotonic()
        run = await harness.submit({"text": "hi"})
        elapsed = time.monotonic() - started
    run.assert_failed(code="TASK_TIMEOUT")
    assert run.message_types == ("started", "failure")
    assert run.outcome is Outcome.ACKED
    assert elapsed < 5.0  # the declared 5 s was overridden by the 0.05 s setting


async def test_a_def_handler_past_its_timeout_fails_while_its_thread_runs_on() -> None:
    # That such a thread is reported stuck: test_executors.py and test_runner.py.
    release, finished = threading.Event(), threading.Event()
    worker = Worker("svc")

    @worker.task(timeout=0.05)
    def handle(task_input: Input, ctx: SyncTaskContext) -> Output:
        release.wait(10)
        finished.set()
        return Output(echoed=task_input.text)

    async with WorkerHarness(worker) as harness:
        run = await harness.submit({"text": "hi"}, task_id="stuck-1")
        run.assert_failed(code="TASK_TIMEOUT")
        assert not finished.is_set()  # concluded without waiting for the thread
        release.set()
        assert await asyncio.to_thread(finished.wait, 10)
    # The late return published nothing more.
    assert [p.report.type for p in harness.transport.published] == ["started", "failure"]


async def test_retryable_error_requeues_until_the_last_attempt_then_concludes(
    decisions: pytest.LogCaptureFixture,
) -> None:
    async with WorkerHarness(make_worker("retry")) as harness:
        runs = [
            await harness.submit({"text": "hi"}, task_id="t-retry", delivery_count=count)
            for count in range(5)
        ]
    for attempt, run in enumerate(runs[:4], start=1):
        assert run.outcome is Outcome.NACKED_REQUEUE
        assert run.settlement.requeue_counted is True
        assert run.message_types == ("started",)
        assert run.messages[0].attempt == attempt
    last = runs[4]
    last.assert_failed(code="UPSTREAM_DOWN")
    assert last.outcome is Outcome.ACKED
    assert last.messages[-1].attempt == 5
    lines = [record.getMessage() for record in decision_records(decisions)]
    assert lines == [
        *(
            f"Delivery settled: outcome=retry action=nack-requeue code=UPSTREAM_DOWN attempt={n}/5"
            for n in range(1, 5)
        ),
        "Delivery settled: outcome=failure action=conclude code=UPSTREAM_DOWN attempt=5/5",
    ]


async def test_the_memory_broker_redelivers_a_retry_with_a_rising_count() -> None:
    async with WorkerHarness(make_worker("retry")) as harness:
        first = await harness.submit({"text": "hi"})
        [message] = list(harness.transport.ready)
        assert message.delivery_count == 1
        assert first.outcome is Outcome.NACKED_REQUEUE


async def test_past_the_delivery_limit_the_task_is_abandoned_without_running() -> None:
    calls: list[str] = []
    async with WorkerHarness(make_worker("ok", calls)) as harness:
        run = await harness.submit({"text": "hi"}, delivery_count=5)
    run.assert_failed(code="TASK_ABANDONED_AFTER_REDELIVERIES")
    assert run.message_types == ("failure",)
    assert run.messages[0].attempt == 6
    assert run.outcome is Outcome.ACKED
    assert calls == []


async def test_the_delivery_limit_setting_is_honoured() -> None:
    overrides = {"worker_delivery_limit": 2}
    async with WorkerHarness(make_worker("retry"), settings_overrides=overrides) as harness:
        first = await harness.submit({"text": "hi"}, delivery_count=0)
        second = await harness.submit({"text": "hi"}, delivery_count=1)
    assert first.outcome is Outcome.NACKED_REQUEUE
    second.assert_failed(code="UPSTREAM_DOWN")
    assert second.settlement.delivery_limit == 2


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\xff\xfe not utf-8", "invalid_utf8"),
        (b'{"a":', "invalid_json"),
        (b"[1, 2, 3]", "not_an_object"),
        (b"[" * 10_000 + b"]" * 10_000, "too_deep"),
        (b'{"task_id": NaN}', "invalid_json"),
        (b"", "invalid_json"),
    ],
)
async def test_poison_bytes_are_rejected_once_and_the_worker_keeps_serving(
    body: bytes, reason: str, decisions: pytest.LogCaptureFixture
) -> None:
    async with WorkerHarness(make_worker("ok")) as harness:
        poison = await harness.submit_raw(body)
        good = await harness.submit({"text": "after"})
    assert poison.outcome is Outcome.REJECTED
    assert poison.messages == ()
    assert poison.task_id is None
    assert poison.settlement.outcome is EngineOutcome.POISON
    assert poison.settlement.poison_reason == reason
    assert [letter.reason for letter in harness.transport.dead_letters] == ["rejected"]
    good.assert_succeeded()
    lines = [record.getMessage() for record in decision_records(decisions)]
    assert lines[0] == "Delivery settled: outcome=poison action=reject code=- attempt=1/5"
    assert len(lines) == 2


async def test_poison_with_a_task_id_is_reported_to_its_client() -> None:
    body = b'{"task_id": "t-poison", "client_id": "c-1", "input": "not an object"}'
    async with WorkerHarness(make_worker("ok")) as harness:
        run = await harness.submit_raw(body)
    run.assert_failed(code="POISON_MESSAGE")
    assert run.task_id == "t-poison"
    assert run.messages[0].client_id == "c-1"
    assert run.outcome is Outcome.ACKED
    assert run.settlement.outcome is EngineOutcome.POISON
    assert run.settlement.poison_reason == "invalid_envelope"
    assert run.error is not None and "input: dict_type" in run.error.message


async def test_an_envelope_for_another_service_is_poison() -> None:
    body = b'{"protocol_version":1,"task_id":"t-1","client_id":"c","service":"other","input":{}}'
    async with WorkerHarness(make_worker("ok")) as harness:
        run = await harness.submit_raw(body)
    run.assert_failed(code="POISON_MESSAGE")
    assert run.settlement.poison_reason == "wrong_service"


async def test_a_body_over_the_size_limit_is_poison() -> None:
    overrides = {"worker_max_message_bytes": 1024}
    async with WorkerHarness(make_worker("ok"), settings_overrides=overrides) as harness:
        run = await harness.submit({"text": "x" * 2000})
    assert run.outcome is Outcome.REJECTED
    assert run.settlement.poison_reason == "too_large"


#: A broker that may time a delivery out 0.5 s after it arrived: the hold is that short.
SHORT_HOLD = {"worker_task_timeout_s": 0.2, "worker_retry_backoff_max_s": 0.1}


async def test_a_success_refused_a_few_times_is_held_then_published_and_acked() -> None:
    async with WorkerHarness(make_worker("ok")) as harness:
        harness.fail_next_publish("success", times=3)
        run = await harness.submit({"text": "hi"})
    run.assert_succeeded()
    assert run.outcome is Outcome.ACKED
    assert harness.transport.ready_count == 0


async def test_a_success_refused_until_the_hold_ends_is_given_back_not_acked(
    decisions: pytest.LogCaptureFixture,
) -> None:
    async with WorkerHarness(
        make_worker("ok"), settings_overrides=SHORT_HOLD, hold_s=0.5
    ) as harness:
        harness.fail_next_publish("success", times=None)
        run = await harness.submit({"text": "hi"})
        assert harness.transport.acked == []
        assert harness.transport.ready_count == 1
        harness.clear_publish_failures()
        retry = await harness.submit({"text": "hi"})
    assert run.outcome is Outcome.NACKED_REQUEUE
    assert run.message_types == ("started",)
    assert run.settlement.outcome is EngineOutcome.PUBLISH_FAILED
    assert run.settlement.requeue_counted is False
    assert run.settlement.reason == "report_held_until_consumer_timeout"
    retry.assert_succeeded()
    line = decision_records(decisions)[0].getMessage()
    assert "outcome=publish_failed action=nack-requeue" in line
    assert line.endswith("reason=report_held_until_consumer_timeout")


async def test_a_started_that_cannot_get_out_gives_the_delivery_back_with_nothing_after_it() -> (
    None
):
    # The handler runs while ``started`` is held (one confirm round trip per task); the
    # success then waits for ``started``, which gives up, and nothing is published.
    async with WorkerHarness(
        make_worker("ok"), settings_overrides=SHORT_HOLD, hold_s=0.5
    ) as harness:
        harness.fail_next_publish(times=None)
        run = await harness.submit({"text": "hi"})
    assert run.outcome is Outcome.NACKED_REQUEUE
    assert run.settlement.requeue_counted is False
    assert run.messages == ()


async def test_a_failed_failure_publish_requeues() -> None:
    async with WorkerHarness(
        make_worker("fatal"), settings_overrides=SHORT_HOLD, hold_s=0.5
    ) as harness:
        harness.fail_next_publish("failure", times=None)
        run = await harness.submit({"text": "hi"})
    assert run.outcome is Outcome.NACKED_REQUEUE
    assert run.settlement.code == "NOT_ALLOWED"


async def test_an_output_that_fails_its_model_is_invalid_result() -> None:
    async with WorkerHarness(make_worker("bad-output")) as harness:
        run = await harness.submit({"text": "hi"})
    run.assert_failed(code="INVALID_RESULT")
    assert run.error is not None and "echoed: missing" in run.error.message


async def test_a_result_over_the_report_limit_is_result_too_large() -> None:
    async with WorkerHarness(make_worker("huge-output")) as harness:
        run = await harness.submit({"text": "hi"})
    run.assert_failed(code="RESULT_TOO_LARGE")
    assert run.outcome is Outcome.ACKED


async def test_every_delivery_logs_exactly_one_decision_line(
    decisions: pytest.LogCaptureFixture,
) -> None:
    async with WorkerHarness(make_worker("ok")) as harness:
        await harness.submit({"text": "a"}, task_id="one")
        await harness.submit({"text": ""}, task_id="two")
        await harness.submit_raw(b"nope")
        await harness.submit({"text": "a"}, task_id="three", delivery_count=9)
    records = decision_records(decisions)
    assert [r.task_id for r in records] == ["one", "two", None, "three"]  # type: ignore[attr-defined]
    assert all(r.levelno == logging.INFO for r in records)


async def test_concurrent_submits_are_each_settled_once() -> None:
    async with WorkerHarness(make_worker("ok"), settings_overrides={"worker_concurrency": 8}) as h:
        runs = await asyncio.gather(*(h.submit({"text": str(n)}) for n in range(50)))
    assert sorted(run.response["echoed"] for run in runs if run.response) == sorted(
        str(n) for n in range(50)
    )
    assert len(h.transport.acked) == 50
    assert all(run.message_types == ("started", "success") for run in runs)


def test_the_harness_checks_the_budget_with_the_production_backoff_cap() -> None:
    worker = Worker("svc")

    @worker.task(timeout=1720.0)  # 1720 + 30 + 1 + 2 + 60 = 1813 s: over 1800 s before 4.3
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        return Output(echoed="")

    with pytest.raises(TimeBudgetError):
        WorkerHarness(worker)


def test_the_harness_checks_the_time_budget_as_at_startup() -> None:
    with pytest.raises(TimeBudgetError) as error:
        WorkerHarness(make_worker("ok"), settings_overrides={"worker_task_timeout_s": 1800})
    assert "WORKER_CONSUMER_TIMEOUT_S" in str(error.value)


def test_the_harness_reads_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_DELIVERY_LIMIT", "9")
    harness = WorkerHarness(make_worker("ok"))
    assert harness.settings.worker_delivery_limit == 5
    assert harness.settings.worker_retry_backoff_max_s == 0.001


async def test_a_closed_harness_refuses_work() -> None:
    harness = WorkerHarness(make_worker("ok"))
    await harness.aclose()
    await harness.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await harness.submit({"text": "hi"})


async def test_assertions_say_what_happened_instead() -> None:
    async with WorkerHarness(make_worker("fatal")) as harness:
        run = await harness.submit({"text": "hi"})
    with pytest.raises(AssertionError, match=r"expected a success, got .*NOT_ALLOWED"):
        run.assert_succeeded()
    with pytest.raises(AssertionError, match="expected a failure with code OTHER"):
        run.assert_failed(code="OTHER")
    run.assert_failed()
    assert run.settlement.action is Action.CONCLUDE


async def test_past_the_hand_out_limit_the_task_is_abandoned_naming_that_limit() -> None:
    # RabbitMQ 4.3: give-backs and consumer timeouts leave x-delivery-count at 0 and raise
    # x-acquired-count; WORKER_ACQUIRED_LIMIT (25 by default) ends such a loop.
    calls: list[str] = []
    async with WorkerHarness(make_worker("ok", calls)) as harness:
        run = await harness.submit({"text": "hi"}, delivery_count=0, acquired_count=25)
        within = await harness.submit({"text": "hi"}, delivery_count=0, acquired_count=24)
    run.assert_failed(code="TASK_ABANDONED_AFTER_REDELIVERIES")
    assert "handed out 26 times" in run.messages[-1].error.message  # type: ignore[union-attr]
    assert "WORKER_ACQUIRED_LIMIT" in run.messages[-1].error.message  # type: ignore[union-attr]
    within.assert_succeeded()
    assert within.messages[0].attempt == 1  # the hand-outs cost no attempt
    assert len(calls) == 1


async def test_a_give_back_in_the_memory_broker_counts_a_hand_out_not_an_attempt() -> None:
    async with WorkerHarness(make_worker("ok")) as harness:
        message = harness.transport.put(b"{}")
        delivery = harness.transport.take(message.message_id)
        assert delivery is not None and delivery.acquired_count == 0
        await delivery.give_back()
        again = harness.transport.take(message.message_id)
    assert again is not None
    assert (again.delivery_count, again.acquired_count, again.redelivered) == (0, 1, True)
    assert again.headers == {"x-acquired-count": 1}
