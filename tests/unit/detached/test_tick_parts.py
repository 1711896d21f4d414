"""The tick's own parts, without a broker: hand-outs, a sweep that stops half-way, lost state."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.conclusion import Failure
from async_task_api_worker.detached.outcomes import detached_conclusion
from async_task_api_worker.detached.state import write_atomically
from async_task_api_worker.detached.tick import (
    DetachedExecutor,
    TickReport,
    run_tick,
    sweep_and_report,
)
from async_task_api_worker.engine.verdict import Swept
from async_task_api_worker.errors import SettingsError
from async_task_api_worker.ports import Action, Delivery, Outcome, Settlement
from async_task_api_worker.settings import load_settings
from async_task_api_worker.transports.memory import InMemoryTransport
from examples.count_words import worker as count_words


def test_a_marker_a_result_or_a_done_says_handed_out_an_input_or_a_temporary_does_not(
    tmp_path: Path,
) -> None:
    executor = DetachedExecutor(tmp_path, "m:worker")
    assert not executor.handed_out("t-1")
    # What a hand-out cut before its commit leaves: the work runs again.
    for name in ("t-1.input", ".t-1.input.1-2-boot.0a1b.tmp", ".t-1.running.1-2-boot.0a1b.tmp"):
        (tmp_path / name).touch()
        assert not executor.handed_out("t-1"), name
        (tmp_path / name).unlink()
    for name in ("t-1.running", "t-1.running#claimed-0a1b", "t-1.json#claimed-0a1b", "t-1.done"):
        (tmp_path / name).touch()
        assert executor.handed_out("t-1"), name  # a claimed result: a sweep is sending it
        (tmp_path / name).unlink()
    (tmp_path / "t-10.running").touch()  # another task, whose id starts alike
    (tmp_path / "t-1.json-b.running").touch()  # and another: "t-1.json-b" (ids may hold dots)
    (tmp_path / "t-1.done-2.done").touch()
    assert not executor.handed_out("t-1")


class FakeEngine:
    """Reports the first result, refuses the second."""

    task_timeout_s = 30.0

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.via: list[Delivery] = []
        self.made_at: list[datetime | None] = []

    async def report_swept(self, swept: Swept, *, via: Delivery, **ids: Any) -> Settlement:
        self.calls.append({**ids, "reason": swept.reason})
        self.via.append(via)
        self.made_at.append(swept.made_at)
        outcome = Outcome.SUCCESS if len(self.calls) == 1 else Outcome.PUBLISH_FAILED
        return Settlement(outcome, Action.NONE, None, ids["task_id"], 1, 7)


async def test_a_sweep_that_stops_half_way_keeps_what_it_delivered(tmp_path: Path) -> None:
    for task_id in ("a-1", "a-2"):
        result = {"ok": True, "response": {}, "meta": {"task_id": task_id}}
        write_atomically(tmp_path / f"{task_id}.json", json.dumps(result).encode())
    engine, report = FakeEngine(), TickReport()
    via = InMemoryTransport().report_only()
    swept = await sweep_and_report(engine, "svc", tmp_path, 1.0, report, via=via)  # type: ignore[arg-type]
    assert engine.via == [via, via]  # each report goes out on the delivery given
    assert swept.delivered == ["a-1"]
    assert not report.ok and "a-2" in report.problems[0]
    assert (tmp_path / "a-2.json").exists()  # for the next tick


async def test_a_result_whose_state_was_lost_is_reported_under_the_queues_limit(
    tmp_path: Path,
) -> None:
    failure = {"ok": False, "error": {"code": "WORKER_DIED", "message": "lost"}, "meta": {}}
    write_atomically(tmp_path / "b-1.json", json.dumps(failure).encode())
    engine = FakeEngine()
    via = InMemoryTransport().report_only()
    await sweep_and_report(engine, "svc", tmp_path, 1.0, TickReport(), via=via)  # type: ignore[arg-type]
    assert engine.calls == [
        {
            "task_id": "b-1",
            "client_id": None,
            "attempt": 1,
            "delivery_limit": None,  # the engine's: the queue's own limit
            "reason": "swept_result",
        }
    ]


async def test_a_result_is_reported_with_the_timestamp_the_sweep_that_first_sent_it_kept(
    tmp_path: Path,
) -> None:
    result = {"ok": True, "response": {}, "meta": {"task_id": "c-1"}}
    result["report_timestamp"] = "2026-01-02T03:04:05.123456Z"  # a sweep killed after its send
    write_atomically(tmp_path / "c-1.json", json.dumps(result).encode())
    engine = FakeEngine()
    via = InMemoryTransport().report_only()
    await sweep_and_report(engine, "svc", tmp_path, 1.0, TickReport(), via=via)  # type: ignore[arg-type]
    assert engine.made_at == [datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)]


def test_a_forged_sdk_code_in_a_result_is_an_invalid_result() -> None:

    forged = detached_conclusion({"ok": False, "error": {"code": "POISON_MESSAGE", "message": "x"}})
    assert isinstance(forged, Failure) and forged.code == "INVALID_RESULT"
    died = detached_conclusion({"ok": False, "error": {"code": "WORKER_DIED", "message": "x"}})
    assert died == Failure("WORKER_DIED", "x")


async def test_a_tick_on_another_transport_than_rabbitmq_is_a_setting_error(
    tmp_path: Path,
) -> None:

    settings = load_settings(
        {
            "WORKER_TRANSPORT": "sqs-sfn",
            "SQS_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/000000000000/q",
        },
        read_environment=False,
    )
    with pytest.raises(SettingsError, match="the tick command runs on RabbitMQ"):
        await run_tick(count_words, "examples.count_words:worker", settings, tmp_path, budget_s=5.0)
