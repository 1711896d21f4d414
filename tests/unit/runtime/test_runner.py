"""The runner's lifecycle on the in-memory broker: serve, drain, give back, stop."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading

import pytest
from pydantic import BaseModel

from async_task_api_worker import SyncTaskContext, TaskContext, Worker
from async_task_api_worker.errors import BrokerUnavailableError
from async_task_api_worker.ports import Delivery
from async_task_api_worker.runtime import ExitCode, Runner, RunnerState
from async_task_api_worker.runtime.entry import run_worker
from async_task_api_worker.runtime.hooks import StartupHookError, shutdown_bound_s
from async_task_api_worker.settings import load_settings
from async_task_api_worker.testing import WorkerHarness
from async_task_api_worker.transports.memory import InMemoryTransport
from async_task_api_worker.transports.memory.messages import message_id_of
from tests.conftest import decision_records
from tests.polling import until

BODY = b'{"protocol_version":1,"task_id":"t-%d","client_id":"c","service":"svc","input":{}}'


class Input(BaseModel):
    pass


class Output(BaseModel):
    ok: bool = True


def body(number: int) -> bytes:
    return BODY.replace(b"%d", str(number).encode())


def quick_worker() -> Worker:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        return Output()

    return worker


def blocking_worker(entered: asyncio.Event) -> Worker:
    worker = Worker("svc")

    @worker.task(timeout=60)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        entered.set()
        await asyncio.Event().wait()
        return Output()

    return worker


def runner_for(worker: Worker, transport: InMemoryTransport, **settings: object) -> Runner:
    return Runner(worker, load_settings(settings, read_environment=False), transport)


async def test_serve_processes_until_a_shutdown_request_then_stops() -> None:
    transport = InMemoryTransport(prefetch=2)
    runner = runner_for(quick_worker(), transport, worker_concurrency=2)
    assert runner.state is RunnerState.CREATED
    for number in range(5):
        transport.put(body(number))
    serving = asyncio.create_task(runner.serve())
    await transport.join()
    assert runner.state is RunnerState.RUNNING
    runner.request_shutdown("test")
    runner.request_shutdown("again")  # idempotent
    assert await serving is ExitCode.OK
    assert runner.state is RunnerState.STOPPED
    assert len(transport.acked) == 5
    with pytest.raises(RuntimeError, match="already called"):
        await runner.serve()


async def test_a_task_past_the_grace_period_is_given_back_without_a_report(
    decisions: pytest.LogCaptureFixture,
) -> None:
    entered = asyncio.Event()
    transport = InMemoryTransport()
    runner = runner_for(blocking_worker(entered), transport, worker_shutdown_grace_s=0.05)
    transport.put(body(1))
    serving = asyncio.create_task(runner.serve())
    await entered.wait()
    assert runner.in_flight == 1
    runner.request_shutdown("SIGTERM")
    assert await serving is ExitCode.OK
    assert [p.report.type for p in transport.published] == ["started"]
    [message] = transport.ready
    assert message.delivery_count == 0  # the give-back did not count
    [line] = decision_records(decisions)
    assert "outcome=shutdown_requeued action=nack-requeue" in line.getMessage()


async def test_a_second_request_ends_the_grace_period_at_once() -> None:
    entered = asyncio.Event()
    transport = InMemoryTransport()
    runner = runner_for(blocking_worker(entered), transport, worker_shutdown_grace_s=600)
    transport.put(body(1))
    serving = asyncio.create_task(runner.serve())
    await entered.wait()
    runner.request_shutdown("SIGTERM")
    await asyncio.sleep(0)  # one turn of the loop: the drain has begun
    assert runner.state is RunnerState.DRAINING
    runner.request_shutdown("SIGTERM")
    assert await asyncio.wait_for(serving, timeout=10) is ExitCode.OK
    assert transport.ready_count == 1


async def test_in_flight_tasks_finish_within_the_grace_period() -> None:
    release = asyncio.Event()
    entered = asyncio.Event()
    worker = Worker("svc")

    @worker.task(timeout=60)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        entered.set()
        await release.wait()
        return Output()

    transport = InMemoryTransport()
    runner = runner_for(worker, transport, worker_shutdown_grace_s=600)
    transport.put(body(1))
    serving = asyncio.create_task(runner.serve())
    await entered.wait()
    runner.request_shutdown("SIGTERM")
    await asyncio.sleep(0)  # one turn of the loop: the handler ends while the drain is on
    release.set()
    assert await serving is ExitCode.OK
    assert [p.report.type for p in transport.published] == ["started", "success"]
    assert len(transport.acked) == 1


class HangingConnect(InMemoryTransport):
    def __init__(self) -> None:
        super().__init__()
        self.connecting = asyncio.Event()

    async def connect(self) -> None:
        self.connecting.set()
        await asyncio.Event().wait()


async def test_a_shutdown_during_startup_does_not_wait_for_the_connection() -> None:
    transport = HangingConnect()
    runner = runner_for(quick_worker(), transport)
    serving = asyncio.create_task(runner.serve())
    await transport.connecting.wait()
    assert runner.state is RunnerState.STARTING
    runner.request_shutdown("SIGTERM")
    assert await asyncio.wait_for(serving, timeout=5) is ExitCode.OK
    assert runner.state is RunnerState.STOPPED


class GivingUp(InMemoryTransport):
    async def deliveries(self):  # type: ignore[no-untyped-def,override]
        raise BrokerUnavailableError("gave up")
        yield  # pragma: no cover


async def test_a_transport_that_gives_up_stops_the_runner_with_failure() -> None:
    runner = runner_for(quick_worker(), GivingUp())
    assert await asyncio.wait_for(runner.serve(), timeout=5) is ExitCode.FAILURE


async def test_def_handlers_get_a_thread_pool_by_default() -> None:
    worker = Worker("svc")
    threads: list[str] = []

    @worker.task(timeout=5)
    def handle(task_input: Input, ctx: SyncTaskContext) -> Output:
        threads.append(threading.current_thread().name)
        return Output()

    transport = InMemoryTransport()
    runner = runner_for(worker, transport)
    transport.put(body(1))
    serving = asyncio.create_task(runner.serve())
    await transport.join()
    runner.request_shutdown("done")
    await serving
    assert threads and threads[0].startswith("task-")


class SlowTake(InMemoryTransport):
    """Hands out deliveries to a runner whose only slot is taken."""

    def __init__(self) -> None:
        super().__init__(prefetch=2)
        self.given_back: list[Delivery] = []

    async def give_back(self, delivery: Delivery) -> None:
        self.given_back.append(delivery)
        await super().give_back(delivery)


async def test_a_delivery_in_hand_but_never_started_is_given_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="async_task_api_worker.engine")
    entered = asyncio.Event()
    transport = SlowTake()
    runner = runner_for(blocking_worker(entered), transport, worker_shutdown_grace_s=0.01)
    transport.put(body(1))
    transport.put(body(2))
    serving = asyncio.create_task(runner.serve())
    await entered.wait()
    # The second is in hand, waiting for the only slot.
    await until(lambda: transport.unacked_count == 2, 5, "two deliveries in hand")
    runner.request_shutdown("SIGTERM")
    assert await serving is ExitCode.OK
    assert {message_id_of(d) for d in transport.given_back} == {1, 2}  # both put
    assert all(m.delivery_count == 0 for m in transport.ready)
    # Each has its decision line, the one never started too.
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Delivery")]
    assert len(lines) == 2
    assert any(line.endswith("reason=never_started") for line in lines)


class Inbox(InMemoryTransport):
    """Receives a message and holds it unhanded, as RabbitMQ's inbox does when a stop comes."""

    def __init__(self) -> None:
        super().__init__()
        self.listening = asyncio.Event()
        self.stopped = asyncio.Event()

    async def deliveries(self):  # type: ignore[no-untyped-def,override]
        self.listening.set()
        await self.stopped.wait()
        return
        yield

    async def stop_consuming(self) -> list[Delivery]:  # type: ignore[override]
        await super().stop_consuming()
        if self.stopped.is_set():  # the close stops it again: nothing is held any more
            return []
        self.stopped.set()
        held = self.take()
        return [] if held is None else [held]


async def test_what_the_transport_received_but_never_handed_out_goes_back_through_the_engine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="async_task_api_worker.engine")
    transport = Inbox()
    runner = runner_for(blocking_worker(asyncio.Event()), transport)
    transport.put(body(1))
    serving = asyncio.create_task(runner.serve())
    await transport.listening.wait()
    runner.request_shutdown("SIGTERM")
    assert await serving is ExitCode.OK
    ((message),) = transport.ready  # back in the queue, its attempt not counted
    assert message.delivery_count == 0 and message.redelivered
    (line,) = decision_records(caplog)
    assert "outcome=shutdown_requeued action=nack-requeue" in line.getMessage()
    assert line.getMessage().endswith("reason=never_started")


def test_run_worker_drains_on_sigterm_and_exits_0() -> None:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        os.kill(os.getpid(), signal.SIGTERM)
        return Output()

    transport = InMemoryTransport()
    transport.put(body(1))
    settings = load_settings({"health_check_port": 0}, read_environment=False)
    runner = Runner(worker, settings, transport)
    assert run_worker(worker, runner=runner) is ExitCode.OK
    assert [p.report.type for p in transport.published] == ["started", "success"]


def test_run_worker_exits_2_on_a_bad_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORKER_CONCURRENCY", "0")
    assert run_worker(quick_worker()) is ExitCode.CONFIG
    assert capsys.readouterr().err.startswith("async-task-api-worker: invalid setting")


def test_harness_and_runner_share_the_engine_rules() -> None:
    assert WorkerHarness(quick_worker()).settings.worker_delivery_limit == 5


async def test_startup_hooks_run_in_order_before_connecting() -> None:
    order: list[str] = []
    worker = quick_worker()

    @worker.on_startup
    async def first() -> None:
        order.append("first")

    @worker.on_startup
    async def second() -> None:
        order.append("second")

    class Recording(InMemoryTransport):
        async def connect(self) -> None:
            order.append("connect")
            await super().connect()

    runner = runner_for(worker, Recording())
    serving = asyncio.create_task(runner.serve())
    await until(lambda: runner.state is RunnerState.RUNNING, 5, "the runner to run")
    runner.request_shutdown("test")
    assert await serving is ExitCode.OK
    assert order == ["first", "second", "connect"]


async def test_a_failing_startup_hook_stops_the_worker_with_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = quick_worker()
    shutdown_ran: list[bool] = []

    @worker.on_startup
    async def load_model() -> None:
        raise FileNotFoundError("/secret/path/model.bin")

    @worker.on_shutdown
    async def cleanup() -> None:
        shutdown_ran.append(True)

    transport = InMemoryTransport()
    runner = runner_for(worker, transport)
    assert await runner.serve() is ExitCode.FAILURE
    assert isinstance(runner.failure, StartupHookError)
    assert shutdown_ran == []  # it never started
    [line] = [r.getMessage() for r in caplog.records if "did not start" in r.getMessage()]
    assert "load_model raised FileNotFoundError" in line
    assert all("/secret/path" not in r.getMessage() for r in caplog.records)


async def test_a_shutdown_during_a_slow_startup_hook_exits_at_once() -> None:
    worker = quick_worker()
    entered = asyncio.Event()

    @worker.on_startup
    async def slow() -> None:
        entered.set()
        await asyncio.sleep(3600)

    runner = runner_for(worker, InMemoryTransport())
    serving = asyncio.create_task(runner.serve())
    await entered.wait()
    runner.request_shutdown("SIGTERM")
    assert await asyncio.wait_for(serving, timeout=5) is ExitCode.OK


async def test_shutdown_hooks_share_one_budget(caplog: pytest.LogCaptureFixture) -> None:
    worker = quick_worker()
    ran: list[str] = []

    @worker.on_shutdown
    async def quick() -> None:
        ran.append("quick")

    @worker.on_shutdown
    async def failing() -> None:
        ran.append("failing")
        raise RuntimeError("nope")

    @worker.on_shutdown
    async def forever() -> None:
        ran.append("forever")
        await asyncio.sleep(3600)

    @worker.on_shutdown
    async def late() -> None:
        ran.append("late")

    runner = runner_for(worker, InMemoryTransport(), worker_shutdown_hooks_timeout_s=0.2)
    serving = asyncio.create_task(runner.serve())
    await until(lambda: runner.state is RunnerState.RUNNING, 5, "the runner to run")
    runner.request_shutdown("test")
    assert await asyncio.wait_for(serving, timeout=5) is ExitCode.OK
    assert ran == ["quick", "failing", "forever"]  # "late" got no time left
    messages = [r.getMessage() for r in caplog.records]
    assert any("failing raised RuntimeError" in m for m in messages)
    assert any("forever ran out of time" in m for m in messages)
    assert any("No time left for shutdown hook" in m and "late" in m for m in messages)


async def test_a_def_handler_still_running_after_the_drain_is_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    started = threading.Event()
    worker = Worker("svc")

    @worker.task(timeout=60)
    def handle(task_input: Input, ctx: SyncTaskContext) -> Output:
        started.set()
        release.wait(30)
        return Output()

    transport = InMemoryTransport()
    runner = runner_for(worker, transport, worker_shutdown_grace_s=0.05)
    transport.put(body(7))
    serving = asyncio.create_task(runner.serve())
    await asyncio.to_thread(started.wait, 10)
    runner.request_shutdown("SIGTERM")
    try:
        assert await serving is ExitCode.FAILURE
        assert runner.stuck_task_ids == ("t-7",)
        assert runner.failure is None
        assert any("handler of task t-7 is still running" in r.getMessage() for r in caplog.records)
    finally:
        release.set()


def test_the_shutdown_bound_follows_the_settings() -> None:
    assert shutdown_bound_s(load_settings({}, read_environment=False)) == 42.0
    short = load_settings({"worker_shutdown_grace_s": 2}, read_environment=False)
    assert shutdown_bound_s(short) == 5 + 17
    hooks = load_settings({"worker_shutdown_hooks_timeout_s": 10}, read_environment=False)
    assert shutdown_bound_s(hooks) == 25 + 5 + 5 + 10 + 2


def job_settings(**values: object) -> dict[str, object]:
    return {"worker_mode": "job", **values}


async def test_job_mode_takes_its_quota_and_leaves_the_rest_untouched() -> None:
    transport = InMemoryTransport(prefetch=1)
    for number in range(5):
        transport.put(body(number))
    runner = runner_for(quick_worker(), transport, **job_settings(worker_job_max_deliveries=2))
    assert await asyncio.wait_for(runner.serve(), timeout=10) is ExitCode.OK
    assert len(transport.acked) == 2
    assert transport.ready_count == 3
    assert all(m.delivery_count == 0 and not m.redelivered for m in transport.ready)


async def test_job_mode_lets_the_last_task_finish_whatever_the_grace_period() -> None:
    worker = Worker("svc")

    @worker.task(timeout=10)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        await asyncio.sleep(0.3)  # work that outlasts the 0.01 s grace period
        return Output()

    transport = InMemoryTransport(prefetch=1)
    transport.put(body(1))
    settings = job_settings(worker_shutdown_grace_s=0.01)
    runner = runner_for(worker, transport, **settings)
    assert await asyncio.wait_for(runner.serve(), timeout=10) is ExitCode.OK
    assert [p.report.type for p in transport.published] == ["started", "success"]


async def test_job_mode_counts_a_poison_message_towards_its_quota() -> None:
    transport = InMemoryTransport(prefetch=1)
    transport.put(b"not json")
    transport.put(body(1))
    runner = runner_for(quick_worker(), transport, **job_settings())
    assert await asyncio.wait_for(runner.serve(), timeout=10) is ExitCode.OK
    assert [letter.reason for letter in transport.dead_letters] == ["rejected"]
    assert transport.ready_count == 1


async def test_job_mode_ends_after_its_idle_wait_with_an_empty_queue() -> None:
    runner = runner_for(
        quick_worker(), InMemoryTransport(), **job_settings(worker_job_idle_timeout_s=0.05)
    )
    assert await asyncio.wait_for(runner.serve(), timeout=10) is ExitCode.OK


async def test_a_failing_task_still_ends_the_job_with_0() -> None:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(task_input: Input, ctx: TaskContext) -> Output:
        raise RuntimeError("business as usual")

    transport = InMemoryTransport(prefetch=1)
    transport.put(body(1))
    runner = runner_for(worker, transport, **job_settings())
    assert await asyncio.wait_for(runner.serve(), timeout=10) is ExitCode.OK
    assert [p.report.type for p in transport.published] == ["started", "failure"]


async def test_a_shutdown_in_job_mode_drains_as_in_service_mode() -> None:
    entered = asyncio.Event()
    transport = InMemoryTransport(prefetch=1)
    transport.put(body(1))
    runner = runner_for(
        blocking_worker(entered), transport, **job_settings(worker_shutdown_grace_s=0.05)
    )
    serving = asyncio.create_task(runner.serve())
    await entered.wait()
    runner.request_shutdown("SIGTERM")
    assert await asyncio.wait_for(serving, timeout=10) is ExitCode.OK
    [message] = transport.ready  # given back past the grace, no failure report
    assert message.delivery_count == 0
    assert [p.report.type for p in transport.published] == ["started"]
