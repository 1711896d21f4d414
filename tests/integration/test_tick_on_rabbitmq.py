"""The ``tick`` command on the real broker: budget kills, dead workers, empty ticks, budget."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aio_pika

from async_task_api_worker.detached import Marker
from async_task_api_worker.detached.state import write_atomically
from async_task_api_worker.protocol.reports import decode_report
from tests.integration.conftest import REPO, Queues, wait_for

TARGET = "tests.integration.workers:sleeping"


def tick(
    queues: Queues, state: Path, *, budget_s: float = 20, max_new: int = 1, **env: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "async_task_api_worker",
            "tick",
            TARGET,
            "--state-dir",
            str(state),
            "--budget-s",
            str(budget_s),
            "--max-new",
            str(max_new),
        ],
        cwd=REPO,
        env=queues.env(ATW_TEST_MARKERS=str(state.parent), **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own group, as cron gives it: killed whole below
    )


async def submit(queues: Queues, *inputs: dict[str, Any]) -> list[str]:
    async with queues.client("sleeping") as client:
        return [await client.submit(task_input) for task_input in inputs]


def submit_raw(queues: Queues, *inputs: dict[str, Any], service: str = "sleeping") -> None:
    """Publish envelopes ``t-0``, ``t-1``... without a client consuming the output queue."""
    from async_task_api_worker.client import build_envelope

    async def publish() -> None:
        connection = await aio_pika.connect(queues.url)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(queues.in_queue, durable=True)
            for number, task_input in enumerate(inputs):
                _, body = build_envelope(
                    task_input, service=service, task_id=f"t-{number}", client_id="c"
                )
                await channel.default_exchange.publish(
                    aio_pika.Message(body), routing_key=queues.in_queue
                )

    asyncio.run(publish())


def reports(queues: Queues) -> list[Any]:
    async def drain() -> list[bytes]:
        connection = await aio_pika.connect(queues.url)
        bodies = []
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(queues.out_queue, durable=True)
            while (message := await queue.get(fail=False, timeout=5)) is not None:
                bodies.append(message.body)
                await message.ack()
        return bodies

    return [decode_report(body) for body in asyncio.run(drain())]


def marker(state: Path, task_id: str) -> dict[str, Any]:
    try:
        return dict(json.loads((state / f"{task_id}.running").read_text()))
    except (OSError, ValueError):
        return {}


def test_a_tick_killed_whole_after_the_spawn_loses_nothing(queues: Queues, tmp_path: Path) -> None:
    state = tmp_path / "state"
    submit_raw(queues, {"seconds": 3})
    first = tick(queues, state, budget_s=60, max_new=2)  # then it waits for a second task
    wait_for(lambda: marker(state, "t-0").get("pid"), what="the detached worker")
    os.killpg(first.pid, signal.SIGKILL)  # the cron's budget kill: the tick's whole group
    first.wait()
    wait_for((state / "t-0.json").exists, what="the detached worker's result")
    # The next tick delivers the result (and acks the input, had the first tick not).
    assert tick(queues, state).wait(timeout=60) == 0
    queues.assert_drained(queues.in_queue)
    assert tick(queues, state).wait(timeout=60) == 0  # nothing left: nothing published
    got = [(report.task_id, report.type) for report in reports(queues)]
    assert got == [("t-0", "started"), ("t-0", "success")]


#: The dead-worker case's task timeout (its marker's deadline, from the hand-out): the end of the
#: first tick and the whole second one (two interpreters started, a connect, a sweep) must fit
#: before it, seconds each on a loaded machine. With 4 s, a loaded CI pass could see the
#: "before the deadline" tick run past it.
DEAD_WORKER_TIMEOUT_S = 15


def test_a_dead_worker_is_reported_once_after_its_deadline(queues: Queues, tmp_path: Path) -> None:
    state = tmp_path / "state"
    submit_raw(queues, {"seconds": 60})
    env = {"WORKER_TASK_TIMEOUT_S": str(DEAD_WORKER_TIMEOUT_S)}
    assert tick(queues, state, **env).wait(timeout=60) == 0
    wait_for(lambda: marker(state, "t-0").get("pid"), what="the worker's pid in its marker")
    pid = marker(state, "t-0")["pid"]
    os.kill(pid, signal.SIGKILL)
    assert tick(queues, state, **env).wait(timeout=60) == 0  # before the deadline: nothing
    # Still before it once that tick ended: its sweep saw a live deadline (else the next
    # assertion would not test "before").
    assert not Marker.from_json(marker(state, "t-0")).past_deadline, "the tick ran past it"
    assert [report.type for report in reports(queues)] == ["started"]
    wait_for(
        lambda: Marker.from_json(marker(state, "t-0")).past_deadline,
        DEAD_WORKER_TIMEOUT_S + 30,
        "the deadline",
    )
    expiry = decisions(logged_tick(queues, state, TARGET, max_new=0, **env))["t-0"]
    assert expiry["msg"] == (
        "Delivery settled: outcome=failure action=none code=WORKER_DIED attempt=1/5 "
        "reason=swept_expiry"
    )
    assert tick(queues, state, **env).wait(timeout=60) == 0
    failures = [report for report in reports(queues) if report.type == "failure"]
    assert len(failures) == 1
    assert failures[0].error.code == "WORKER_DIED"  # type: ignore[union-attr]


def test_a_tick_returns_within_its_budget_with_long_tasks_queued(
    queues: Queues, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    submit_raw(queues, *({"seconds": 30} for _ in range(10)))
    budget_s = 8.0
    started = time.monotonic()
    run = tick(queues, state, budget_s=budget_s, max_new=10)
    assert run.wait(timeout=60) == 0
    assert time.monotonic() - started < budget_s
    spawned = list(state.glob("*.running"))
    assert spawned  # it took work, then stopped in time
    for path in spawned:  # the detached workers would sleep 30 s more
        pid = json.loads(path.read_text()).get("pid")
        if pid:
            os.killpg(pid, signal.SIGKILL)


def test_a_tick_with_no_new_message_still_delivers_finished_results(
    queues: Queues, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    meta = {"task_id": "t-done", "client_id": "c", "attempt": 1, "delivery_limit": 5}
    result = {"ok": True, "response": {"attempt": 1}, "correlation_id": "t-done", "meta": meta}
    write_atomically(state / "t-done.json", json.dumps(result).encode())
    assert tick(queues, state).wait(timeout=60) == 0
    (report,) = reports(queues)
    assert (report.task_id, report.type) == ("t-done", "success")
    assert report.response == {"attempt": 1}  # type: ignore[union-attr]
    assert [path.name for path in state.iterdir()] == ["t-done.done"]  # the redelivery guard


def test_a_redelivered_input_whose_report_went_out_is_acked_not_run_again(
    queues: Queues, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "t-0.done").touch()  # what the sweep left when it published t-0's report
    submit_raw(queues, {"seconds": 0})  # the same task, delivered again
    assert tick(queues, state).wait(timeout=60) == 0
    queues.assert_drained(queues.in_queue)
    assert reports(queues) == []
    assert not list(state.glob("*.running"))


def logged_tick(
    queues: Queues, state: Path, target: str, *, max_new: int, **env: str
) -> list[dict[str, Any]]:
    """Run a tick to its end; its JSON log lines."""
    done = subprocess.run(
        [
            sys.executable, "-m", "async_task_api_worker", "tick", target,
            "--state-dir", str(state), "--budget-s", "20", "--max-new", str(max_new),
        ],
        cwd=REPO,
        env=queues.env(ATW_TEST_MARKERS=str(state.parent), LOG_LEVEL="INFO", **env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def decisions(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {line["task_id"]: line for line in lines if line["msg"].startswith("Delivery settled:")}


async def decided_by_run(task_input: dict[str, Any]) -> tuple[str, str]:
    """The decision line and the failure message ``run``'s engine gives ``task_input``."""
    from async_task_api_worker.testing import WorkerHarness
    from tests.integration.workers import strict

    async with WorkerHarness(strict) as harness:
        run = await harness.submit(task_input, task_id="t-1")
    assert run.error is not None
    line = (
        f"Delivery settled: outcome={run.settlement.outcome.value} "
        f"action={run.settlement.action.value} code={run.settlement.code} "
        f"attempt={run.settlement.attempt}/{run.settlement.delivery_limit}"
    )
    return line, run.error.message


def test_a_tick_settles_as_run_does_with_one_decision_line_for_each_delivery_and_result(
    queues: Queues, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    invalid = {"seconds": 0, "customer_secret_field": 1}
    submit_raw(queues, {"seconds": 0}, invalid, service="strict")
    first = decisions(logged_tick(queues, state, "tests.integration.workers:strict", max_new=2))
    run_line, run_message = asyncio.run(decided_by_run(invalid))
    assert first["t-1"]["msg"] == run_line  # the same admission and settlement as run
    assert first["t-0"]["msg"] == "Delivery settled: outcome=detached action=ack code=- attempt=1/5"
    wait_for((state / "t-0.json").exists, what="the detached worker's result")
    second = decisions(logged_tick(queues, state, "tests.integration.workers:strict", max_new=0))
    assert second["t-0"]["msg"] == (
        "Delivery settled: outcome=success action=none code=- attempt=1/5 reason=swept_result"
    )
    got = {(report.task_id, report.type): report for report in reports(queues)}
    assert set(got) == {("t-0", "started"), ("t-0", "success"), ("t-1", "failure")}
    message = got[("t-1", "failure")].error.message  # type: ignore[union-attr]
    assert message == run_message
    assert "customer_secret_field" not in message and "<key>" in message


def test_a_tick_whose_report_the_broker_refuses_exits_1_with_one_line_and_keeps_the_result(
    queues: Queues, tmp_path: Path
) -> None:
    # Every publish nacked: a classic queue of max length 1, reject-publish, one message in (a
    # 3.10 quorum queue lets a fresh channel's first publish through).
    async def fill_output_queue() -> None:
        connection = await aio_pika.connect(queues.url)
        async with connection:
            channel = await connection.channel()
            arguments = {
                "x-queue-type": "classic",
                "x-max-length": 1,
                "x-overflow": "reject-publish",
            }
            await channel.declare_queue(queues.out_queue, durable=True, arguments=arguments)
            await channel.default_exchange.publish(
                aio_pika.Message(b"filler"), routing_key=queues.out_queue
            )

    asyncio.run(fill_output_queue())
    state = tmp_path / "state"
    state.mkdir()
    meta = {"task_id": "t-held", "client_id": "c", "attempt": 1, "delivery_limit": 5}
    result = {"ok": True, "response": {"attempt": 1}, "correlation_id": "t-held", "meta": meta}
    write_atomically(state / "t-held.json", json.dumps(result).encode())
    done = subprocess.run(
        [
            sys.executable, "-m", "async_task_api_worker", "tick", TARGET,
            "--state-dir", str(state), "--budget-s", "12",
        ],
        cwd=REPO,
        env=queues.env(ATW_TEST_MARKERS=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    said = [line for line in done.stderr.splitlines() if "could not report or settle" in line]
    assert len(said) == 1
    assert (state / "t-held.json").exists()  # a later tick sends it
    decided = decisions([json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")])
    assert "outcome=publish_failed action=none" in decided["t-held"]["msg"]


def test_a_redelivery_while_another_tick_sends_its_result_is_acked_not_run_again(
    queues: Queues, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    # Another tick's sweep has claimed t-0's result and is sending it right now.
    meta = {"task_id": "t-0", "client_id": "c", "attempt": 1, "delivery_limit": 5}
    result = {"ok": True, "response": {"attempt": 1}, "correlation_id": "t-0", "meta": meta}
    write_atomically(state / "t-0.json#claimed-0123abcd", json.dumps(result).encode())
    submit_raw(queues, {"seconds": 0})  # t-0 again: the first tick was killed before its ack
    lines = logged_tick(queues, state, TARGET, max_new=1)
    assert decisions(lines)["t-0"]["msg"] == (
        "Delivery settled: outcome=detached action=ack code=- attempt=1/5 reason=already_handed_out"
    )
    queues.assert_drained(queues.in_queue)
    assert reports(queues) == []  # no second `started`, no second run
    assert not list(state.glob("t-0.running")) and not list(tmp_path.glob("t-0.*.*"))
