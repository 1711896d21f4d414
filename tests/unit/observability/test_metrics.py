"""The metrics after a scripted run, read from ``/metrics`` of the real probes server."""

from __future__ import annotations

import asyncio
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from async_task_api_worker import FatalError, RetryableError, TaskContext, Worker, __version__
from async_task_api_worker.client import build_envelope
from async_task_api_worker.observability.metrics import MAX_USER_CODES, OTHER_CODE, WorkerMetrics
from async_task_api_worker.ports import (
    Action,
    CancelRequested,
    DeliveryReceived,
    DeliverySettled,
    Outcome,
    ProgressDropped,
    PublishFailed,
    ReportPublished,
    Settlement,
)
from async_task_api_worker.protocol.codes import ErrorCode
from async_task_api_worker.runtime import Runner
from async_task_api_worker.runtime.observed import serving_probes
from async_task_api_worker.settings import load_settings
from async_task_api_worker.transports.memory import InMemoryTransport
from tests.probes_client import request

SEED_NAMES = {
    "worker_tasks",
    "worker_task_duration_seconds",
    "worker_messages_published",
    "event_loop_lag_seconds",
    "worker_task_failures",
    "worker_task_retries",
    "worker_poison_messages",
    "worker_publish_failures",
    "worker_ack_failures",
    "worker_tasks_in_flight",
    "worker_shutdown_requeued",
    "worker_progress_dropped",
    "worker_sdk_info",
}


class Job(BaseModel):
    mode: Literal["ok", "fatal", "retry", "progress"]


class Done(BaseModel):
    ok: bool = True


def scripted_worker() -> Worker:
    worker = Worker("svc")

    @worker.task(timeout=5)
    async def handle(job: Job, ctx: TaskContext) -> Done:
        if job.mode == "fatal":
            raise FatalError("NOT_ALLOWED", "no")
        if job.mode == "retry" and ctx.attempt == 1:
            raise RetryableError("BUSY", "later")
        if job.mode == "progress":
            await ctx.progress(0.5)
            await ctx.progress(0.2)  # backwards: dropped
        return Done()

    return worker


def envelope(mode: str, number: int, service: str = "svc") -> bytes:
    _, body = build_envelope({"mode": mode}, service=service, task_id=f"t-{number}", client_id="c")
    return body


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def run_and_scrape(bodies: list[bytes], *, fail_publish: str | None = None) -> str:
    settings = load_settings(
        {
            "health_check_host": "127.0.0.1",
            "health_check_port": 0,
            "worker_retry_backoff_s": 0.001,
            "worker_progress_min_interval_s": 0.001,
        },
        read_environment=False,
    )
    transport = InMemoryTransport(prefetch=1)
    if fail_publish:
        transport.fail_next_publish(fail_publish)
    for body in bodies:
        transport.put(body)
    runner = Runner(scripted_worker(), settings, transport)
    async with serving_probes(runner) as server:
        serving = asyncio.ensure_future(runner.serve())
        await transport.join()
        answer = await request(server.port, "/metrics")
        runner.request_shutdown("test over")
        await serving
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("text/plain")
    return answer.body.decode()


async def test_a_scripted_run_shows_each_counter_with_its_exact_value() -> None:
    bodies = [
        envelope("ok", 1),
        envelope("ok", 2),
        envelope("ok", 3),
        envelope("fatal", 4),
        envelope("retry", 5),
        envelope("progress", 6),
        b"not json",
        envelope("ok", 7, service="another-service"),
    ]
    found = samples(await run_and_scrape(bodies, fail_publish="started"))

    def value(name: str, **labels: str) -> float:
        return found[(name, tuple(sorted(labels.items())))]

    # t-1's started report fails once, then goes out on the in-place retry.
    assert value("worker_publish_failures_total", message_type="started") == 1
    assert value("worker_publish_failures_total", message_type="success") == 0
    assert value("worker_tasks_total", status="success") == 5  # t-1 t-2 t-3 t-5 t-6
    assert value("worker_tasks_total", status="failure") == 1
    assert value("worker_tasks_total", status="retry") == 1
    assert value("worker_tasks_total", status="poison") == 2
    assert value("worker_tasks_total", status="publish_failed") == 0
    assert value("worker_task_retries_total") == 1
    assert value("worker_task_failures_total", code="NOT_ALLOWED") == 1
    assert value("worker_task_failures_total", code="POISON_MESSAGE") == 1
    assert value("worker_poison_messages_total", reason="invalid_json") == 1
    assert value("worker_poison_messages_total", reason="wrong_service") == 1
    assert value("worker_progress_dropped_total", reason="backwards") == 1
    assert value("worker_messages_published_total", message_type="started") == 7
    assert value("worker_messages_published_total", message_type="progress") == 1
    assert value("worker_messages_published_total", message_type="success") == 5
    assert value("worker_messages_published_total", message_type="failure") == 2
    assert value("worker_ack_failures_total") == 0
    assert value("worker_shutdown_requeued_total") == 0
    assert value("worker_tasks_in_flight") == 0
    assert value("worker_task_duration_seconds_count") == 7  # deliveries whose handler ran
    assert value("worker_sdk_info", version=__version__) == 1
    assert ("event_loop_lag_seconds", (("component", "worker"),)) in found
    names = {name for name, _ in found}
    assert any(name.startswith("process_") for name in names)
    assert any(name.startswith("python_gc_") for name in names)
    assert "python_info" in names
    assert not any(name.endswith("_created") for name in names)


async def test_every_seed_metric_is_there_and_no_series_carries_a_task_label() -> None:
    text = await run_and_scrape([envelope("ok", 1)])
    families = {family.name for family in text_string_to_metric_families(text)}
    assert families >= SEED_NAMES
    forbidden = {"task_id", "client_id", "service"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert not forbidden & set(sample.labels), sample


async def test_the_number_of_series_does_not_grow_with_the_tasks() -> None:
    few = samples(await run_and_scrape([envelope("ok", n) for n in range(3)]))
    many = samples(await run_and_scrape([envelope("ok", n) for n in range(60)]))
    worker_series = {key for key in few if key[0].startswith(("worker_", "event_loop"))}
    assert worker_series == {key for key in many if key[0].startswith(("worker_", "event_loop"))}


def settled(code: str) -> DeliverySettled:
    settlement = Settlement(Outcome.FAILURE, Action.CONCLUDE, code, "t", 1, 5)
    return DeliverySettled(settlement, 0.1, True)


def test_user_codes_past_the_bound_and_invalid_codes_count_as_other() -> None:
    metrics = WorkerMetrics()
    for number in range(MAX_USER_CODES + 6):
        metrics.notify(DeliveryReceived())
        metrics.notify(settled(f"CODE_{number}"))
    metrics.notify(settled("not a code"))
    metrics.notify(settled("TASK_TIMEOUT"))  # an SDK code always has its own series
    body = samples(metrics.exposition()[0].decode())
    codes = {
        dict(labels)["code"]: v
        for (name, labels), v in body.items()
        if name == "worker_task_failures_total"
    }
    assert len(codes) == len(ErrorCode) + MAX_USER_CODES + 1
    assert codes[OTHER_CODE] == 7
    assert codes["TASK_TIMEOUT"] == 1
    assert codes["CODE_0"] == 1


def test_unknown_label_values_from_events_are_folded() -> None:
    metrics = WorkerMetrics()
    metrics.notify(ProgressDropped("made_up"))
    metrics.notify(ReportPublished("made_up"))
    body = samples(metrics.exposition()[0].decode())
    assert body[("worker_progress_dropped_total", (("reason", "other"),))] == 1
    assert body[("worker_messages_published_total", (("message_type", "other"),))] == 1


def test_openmetrics_is_served_when_asked() -> None:
    body, content_type = WorkerMetrics().exposition("application/openmetrics-text")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


def test_loop_lag_is_recorded_in_seconds() -> None:
    metrics = WorkerMetrics()
    metrics.set_loop_lag(0.25)
    body = samples(metrics.exposition()[0].decode())
    assert body[("event_loop_lag_seconds", (("component", "worker"),))] == 0.25
    metrics.set_loop_lag(-0.001)  # a timer that fired early is no lag
    body = samples(metrics.exposition()[0].decode())
    assert body[("event_loop_lag_seconds", (("component", "worker"),))] == 0.0


def test_the_worst_case_stays_within_the_documented_148_series() -> None:
    metrics = WorkerMetrics()
    for number in range(3 * MAX_USER_CODES):
        metrics.notify(DeliveryReceived())
        metrics.notify(settled(f"CODE_{number}"))
    metrics.notify(ReportPublished("made_up"))
    metrics.notify(PublishFailed("made_up"))
    metrics.notify(ProgressDropped("made_up"))
    metrics.notify(CancelRequested("made_up"))
    poison = Settlement(Outcome.POISON, Action.REJECT, None, None, 1, 5, poison_reason="made_up")
    metrics.notify(DeliverySettled(poison, 0.1, False))
    ours = [
        key
        for key in samples(metrics.exposition()[0].decode())
        if key[0].startswith(("worker_", "event_loop_"))
    ]
    assert len(ours) == 148


def test_the_content_type_never_echoes_the_client() -> None:
    metrics = WorkerMetrics()
    for accept in (
        "application/openmetrics-text; version=9.9\r\nX: y",
        "text/plain; version=1.x",
        "application/openmetrics-text; version=1.0.x",
    ):
        body, content_type = metrics.exposition(accept)
        assert content_type in {
            "text/plain; version=0.0.4; charset=utf-8",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
        assert body


def test_a_lapsed_lease_is_counted_once_per_run() -> None:
    metrics = WorkerMetrics()
    lapsed = Settlement(
        Outcome.CANCELLED, Action.NACK_REQUEUE, None, "t", 1, 5, reason="lease_lapsed"
    )
    withdrawn = Settlement(
        Outcome.CANCELLED, Action.NONE, None, "t", 1, 5, reason="delivery_withdrawn"
    )
    for settlement in (lapsed, withdrawn):
        metrics.notify(DeliveryReceived())
        metrics.notify(DeliverySettled(settlement, 0.1, True))
    body = samples(metrics.exposition()[0].decode())
    assert body[("worker_lease_lapses_total", ())] == 1.0
