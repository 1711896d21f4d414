"""An executor whose work outlives the delivery: ``started`` first, a redelivery not run again,
its result reported later (the tick's sweep)."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel

from async_task_api_worker import TaskContext, Worker
from async_task_api_worker.conclusion import ExecutionResult, HandedOff, Response
from async_task_api_worker.engine import Engine
from async_task_api_worker.engine.decision import Reason
from async_task_api_worker.engine.verdict import Swept
from async_task_api_worker.errors import PublishError
from async_task_api_worker.ports import Action, Delivery, ExecutionRequest, Outcome
from async_task_api_worker.protocol import EncodedReport
from async_task_api_worker.settings import load_settings
from async_task_api_worker.transports.memory import InMemoryTransport

BODY = b'{"protocol_version":1,"task_id":"t-1","client_id":"c","service":"svc","input":{}}'


class Input(BaseModel):
    pass


class Output(BaseModel):
    pass


class HandingOff:
    """Hands each task off once ``started`` is confirmed; remembers what it handed off."""

    hands_off = True

    def __init__(self, transport: InMemoryTransport, handed: set[str]) -> None:
        self.transport = transport
        self.handed = handed
        self.confirmed_at_hand_off: list[list[str]] = []

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def handed_out(self, task_id: str) -> bool:
        return task_id in self.handed

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        assert request.task_id not in self.handed, "the engine asks handed_out first"
        assert request.started is not None
        await request.started()
        self.confirmed_at_hand_off.append([p.report.type for p in self.transport.published])
        self.handed.add(request.task_id)
        return HandedOff()


class RefusesStarted(InMemoryTransport):
    async def publish(self, delivery: Delivery, report: EncodedReport) -> None:
        if report.type == "started":
            raise PublishError("not confirmed")
        await super().publish(delivery, report)


def worker() -> Worker:
    definition = Worker("svc")

    @definition.task(timeout=60)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:  # pragma: no cover
        return Output()

    return definition


def engine_on(
    transport: InMemoryTransport, executor: HandingOff, hold_s: float | None = None
) -> Engine:
    return Engine(
        worker(), load_settings({}, read_environment=False), transport, executor, hold_s=hold_s
    )


def deliver(transport: InMemoryTransport) -> Delivery:
    transport.put(BODY)
    delivery = transport.take()
    assert delivery is not None
    return delivery


async def test_the_work_is_handed_off_only_once_started_is_confirmed() -> None:
    transport = InMemoryTransport()
    executor = HandingOff(transport, set())
    settlement = await engine_on(transport, executor).handle(deliver(transport))
    assert (settlement.outcome, settlement.action, settlement.reason) == (
        Outcome.DETACHED,
        Action.ACK,
        None,
    )
    assert executor.confirmed_at_hand_off == [["started"]]
    assert [p.report.type for p in transport.published] == ["started"]  # the rest comes later


async def test_a_redelivery_of_a_task_handed_out_is_acked_with_no_started_and_no_second_run() -> (
    None
):
    transport = InMemoryTransport()
    executor = HandingOff(transport, {"t-1"})
    settlement = await engine_on(transport, executor).handle(deliver(transport))
    assert (settlement.outcome, settlement.action, settlement.reason) == (
        Outcome.DETACHED,
        Action.ACK,
        "already_handed_out",
    )
    assert transport.published == []
    assert executor.confirmed_at_hand_off == []


async def test_a_redelivery_past_the_limit_of_a_task_handed_out_is_not_abandoned() -> None:
    # A tick killed after its hand-out and before its ack, again and again: the count grows past
    # the limit, but the work is out and its sweep reports it; TASK_ABANDONED would be a second,
    # contradicting terminal report.
    transport = InMemoryTransport()
    executor = HandingOff(transport, {"t-1"})
    engine = engine_on(transport, executor)
    limit = load_settings({}, read_environment=False).worker_delivery_limit
    transport.put(BODY, delivery_count=limit + 5)
    delivery = transport.take()
    assert delivery is not None
    settlement = await engine.handle(delivery)
    assert (settlement.outcome, settlement.action, settlement.reason) == (
        Outcome.DETACHED,
        Action.ACK,
        "already_handed_out",
    )
    assert transport.published == []


async def test_a_redelivery_past_the_limit_of_a_task_never_handed_out_is_abandoned() -> None:
    transport = InMemoryTransport()
    executor = HandingOff(transport, set())
    limit = load_settings({}, read_environment=False).worker_delivery_limit
    transport.put(BODY, delivery_count=limit + 5)
    delivery = transport.take()
    assert delivery is not None
    await engine_on(transport, executor).handle(delivery)
    assert [p.report.type for p in transport.published] == ["failure"]
    assert b"TASK_ABANDONED_AFTER_REDELIVERIES" in transport.published[0].report.body
    assert executor.handed == set()


async def test_a_started_that_does_not_get_out_hands_nothing_off_and_gives_the_delivery_back() -> (
    None
):
    transport = RefusesStarted()
    executor = HandingOff(transport, set())
    engine = engine_on(transport, executor, hold_s=0.1)
    settlement = await engine.handle(deliver(transport))
    assert (settlement.outcome, settlement.action, settlement.requeue_counted) == (
        Outcome.PUBLISH_FAILED,
        Action.NACK_REQUEUE,
        False,
    )
    assert settlement.reason == "report_held_until_consumer_timeout"
    assert executor.handed == set()


async def test_a_result_reported_again_after_a_killed_sweep_is_the_same_report() -> None:
    transport = InMemoryTransport()
    engine = engine_on(transport, HandingOff(transport, set()))
    made_at = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)  # when a sweep first made it
    for _ in range(2):  # that sweep was killed after its send: the next one sends it again
        await engine.report_swept(
            Swept(Response({}), Reason.SWEPT_RESULT, made_at),
            via=transport.report_only(),
            task_id="t-1",
            client_id="c",
            attempt=1,
            delivery_limit=None,
        )
    first, again = (published.report for published in transport.published)
    assert first.body == again.body and first.properties == again.properties  # one message id
    assert first.report.timestamp == "2026-01-02T03:04:05.123456Z"


async def test_a_swept_result_no_report_can_carry_is_its_failure_and_settles_nothing() -> None:
    # The detached worker's result holds a lone surrogate: INVALID_RESULT is reported instead,
    # and the verdict stays the sweep's (action none): its delivery was acked at hand-off.
    transport = InMemoryTransport()
    engine = engine_on(transport, HandingOff(transport, set()))
    settlement = await engine.report_swept(
        Swept(Response({"text": "\ud800"}), Reason.SWEPT_RESULT),
        via=transport.report_only(),
        task_id="t-1",
        client_id="c",
        attempt=1,
        delivery_limit=None,
    )
    assert (settlement.action, settlement.reason, settlement.settled) == (
        Action.NONE,
        "swept_result",
        True,
    )
    assert settlement.code == "INVALID_RESULT"
    assert [p.report.type for p in transport.published] == ["failure"]
