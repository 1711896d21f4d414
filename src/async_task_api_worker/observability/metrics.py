"""The worker's Prometheus metrics, on a registry of its own.

Source: seed "Probes, metrics and logs", name for name. No metric has a task, client or
service label (the scrape adds the pod and the service); every label takes its values from a
fixed set, so the number of series is bounded whatever the traffic:

========================================  =========================================  ===========
metric                                    labels                                      series
========================================  =========================================  ===========
``worker_tasks_total``                    ``status``: a settlement outcome            10
``worker_task_duration_seconds``          (histogram, arrival to settle, ran tasks)   21 (buckets)
``worker_messages_published_total``       ``message_type``: a report type             4
``event_loop_lag_seconds``                ``component``: ``worker``                   1
``worker_task_failures_total``            ``code``: SDK codes, then up to 64 user     <= 76
                                          codes, then ``OTHER``
``worker_task_retries_total``             (none)                                      1
``worker_poison_messages_total``          ``reason``: a poison reason                 8
``worker_publish_failures_total``         ``message_type``: a report type             4
``worker_ack_failures_total``             (none)                                      1
``worker_tasks_in_flight``                (none)                                      1
``worker_shutdown_requeued_total``        (none)                                      1
``worker_progress_dropped_total``         ``reason``: a progress drop reason          6
``worker_lease_lapses_total``              (none)                                      1
``worker_cancel_requests_total``           ``result``: a cancel request's result       5
``worker_consumer_cancels_total``          ``cause``: a consumer cancel's cause        2
``worker_sdk_info``                       ``version``                                 1
========================================  =========================================  ===========

At most 148 series in all (a value outside a fixed set, which only a bug could send, is
counted as ``other``), plus prometheus-client's process, platform and GC collectors. A user
error code is a label value only if it matches the protocol's code pattern, and only the
first :data:`MAX_USER_CODES` distinct ones get their own series; later ones are counted as
``OTHER`` (a handler building codes from data cannot blow up the scrape).

One more counter lives on prometheus-client's default registry, for the processes that sweep
detached state (docs/detached.md): ``worker_detached_unreadable_files_total`` (``kind``:
``marker`` or ``result``; 2 series).

Several worker processes (``run --processes N``) write their values to prometheus-client's
multiprocess files, and their supervisor serves them as one worker's
(``observability.processes.ProcessesMetrics``); each gauge says how it adds up
(``multiprocess_mode``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from async_task_api_worker._version import __version__
from async_task_api_worker.context import ProgressDropReason
from async_task_api_worker.events import Reason
from async_task_api_worker.ports import (
    AckFailed,
    CancelCause,
    CancelRequested,
    CancelResult,
    ConsumerCancelled,
    DeliveryReceived,
    DeliverySettled,
    EngineEvent,
    Outcome,
    ProgressDropped,
    PublishFailed,
    ReportPublished,
)
from async_task_api_worker.protocol.codes import (
    ERROR_CODE_PATTERN,
    ErrorCode,
    PoisonReason,
    ReportType,
)

__all__ = [
    "DETACHED_FILE_KINDS",
    "DETACHED_UNREADABLE_FILES",
    "LOOP_LAG_COMPONENT",
    "MAX_USER_CODES",
    "OTHER_CODE",
    "WorkerMetrics",
    "exposition_of",
]

#: Distinct user error codes that get a series of their own in ``worker_task_failures_total``.
MAX_USER_CODES: Final = 64
#: The ``code`` label of any other failure code.
OTHER_CODE: Final = "OTHER"
#: The ``component`` of the worker's own event loop in ``event_loop_lag_seconds``.
LOOP_LAG_COMPONENT: Final = "worker"

#: Seconds: from a quick task to an hour-long one.
DURATION_BUCKETS_S: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)

_SDK_CODES: Final = frozenset(ErrorCode)

#: The ``kind`` of a detached state file in ``worker_detached_unreadable_files_total``.
DETACHED_FILE_KINDS: Final = ("marker", "result")
#: Detached state files (``async_task_api_worker.detached``) a sweep could not read. Unlike
#: :class:`WorkerMetrics`, on prometheus-client's default registry: a sweep runs in its
#: caller's process (the ``tick`` command, a script), and that registry is what it serves.
DETACHED_UNREADABLE_FILES: Final = Counter(
    "worker_detached_unreadable_files_total",
    "Detached state files a sweep could not read and moved to bad/, by kind (marker, result).",
    ["kind"],
)
for _kind in DETACHED_FILE_KINDS:
    DETACHED_UNREADABLE_FILES.labels(_kind)


class WorkerMetrics:
    """The worker's metrics, fed by the engine's events (an engine ``Observer``).

    Args:
        registry: where the metrics live; default: a new registry, holding the process,
            platform and GC collectors too (the global ``prometheus_client.REGISTRY`` is never
            touched, so two workers in one process do not clash).

    Every labelled series of a fixed set starts at 0, so that ``rate()`` sees its first
    increment.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        if registry is None:
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
        self.registry = registry
        self._user_codes: set[str] = set()
        self.tasks = Counter(
            "worker_tasks_total",
            "Deliveries settled, by outcome (success, failure, poison, retry, publish_failed, "
            "shutdown_requeued, cancelled, cancelled_by_client, engine_error, detached).",
            ["status"],
            registry=registry,
        )
        self.duration = Histogram(
            "worker_task_duration_seconds",
            "Seconds from a delivery's arrival to its settle, for deliveries whose handler ran.",
            buckets=DURATION_BUCKETS_S,
            registry=registry,
        )
        self.published = Counter(
            "worker_messages_published_total",
            "Reports confirmed by the broker, by type.",
            ["message_type"],
            registry=registry,
        )
        self.loop_lag = Gauge(
            "event_loop_lag_seconds",
            "The largest delay of the event loop's 0.5 s timer in the last 60 s, in seconds.",
            ["component"],
            registry=registry,
            # Several processes: the worst live loop, which is what a lag alert is about.
            multiprocess_mode="livemax",
        )
        self.failures = Counter(
            "worker_task_failures_total",
            "Failure reports published, by error code (user codes past the first "
            f"{MAX_USER_CODES} are counted as {OTHER_CODE}).",
            ["code"],
            registry=registry,
        )
        self.retries = Counter(
            "worker_task_retries_total",
            "Deliveries requeued for a retry after a RetryableError.",
            registry=registry,
        )
        self.poison = Counter(
            "worker_poison_messages_total",
            "Deliveries refused as poison messages, by reason.",
            ["reason"],
            registry=registry,
        )
        self.publish_failures = Counter(
            "worker_publish_failures_total",
            "Report publishes the broker did not confirm, by type (each try counts).",
            ["message_type"],
            registry=registry,
        )
        self.ack_failures = Counter(
            "worker_ack_failures_total",
            "Settles (ack, requeue, reject) that did not reach the broker.",
            registry=registry,
        )
        self.in_flight = Gauge(
            "worker_tasks_in_flight",
            "Deliveries taken by the engine and not settled yet.",
            registry=registry,
            # Several processes: a dead one's deliveries went back to the broker with it.
            multiprocess_mode="livesum",
        )
        self.shutdown_requeued = Counter(
            "worker_shutdown_requeued_total",
            "Deliveries given back to the queue at the end of the shutdown grace period.",
            registry=registry,
        )
        self.progress_dropped = Counter(
            "worker_progress_dropped_total",
            "Progress updates not published, by reason.",
            ["reason"],
            registry=registry,
        )
        self.cancel_requests = Counter(
            "worker_cancel_requests_total",
            "Cancel requests received, by what they did (running, remembered, finished, "
            "not_remembered, malformed).",
            ["result"],
            registry=registry,
        )
        self.consumer_cancels = Counter(
            "worker_consumer_cancels_total",
            "Consumers the broker cancelled (basic.cancel), by cause (consumer_timeout, other); "
            "the worker consumed again each time.",
            ["cause"],
            registry=registry,
        )
        self.lease_lapses = Counter(
            "worker_lease_lapses_total",
            "Process-isolated runs stopped by their lease (their worker did not renew it for "
            "two heartbeats: frozen, blocked or cut off); nothing was reported for them.",
            registry=registry,
        )
        Info("worker_sdk", "The async-task-api-worker SDK.", registry=registry).info(
            {"version": __version__}
        )
        # The children every task touches, looked up once: labels() takes a lock and builds a
        # key on each call, a few percent of a task's CPU at thousands of tasks per second.
        self._tasks_by_outcome = {outcome: self.tasks.labels(outcome.value) for outcome in Outcome}
        self._published_by_type = {
            report_type.value: self.published.labels(report_type.value)
            for report_type in ReportType
        }
        for report_type in ReportType:
            self.publish_failures.labels(report_type.value)
        for code in ErrorCode:
            self.failures.labels(code.value)
        for reason in PoisonReason:
            self.poison.labels(reason.value)
        for drop in ProgressDropReason:
            self.progress_dropped.labels(drop.value)
        for result in CancelResult:
            self.cancel_requests.labels(result.value)
        for cause in CancelCause:
            self.consumer_cancels.labels(cause.value)
        self.loop_lag.labels(LOOP_LAG_COMPONENT).set(0.0)

    def notify(self, event: EngineEvent) -> None:
        """Count one engine event."""
        if isinstance(event, DeliverySettled):
            self._settled(event)
        elif isinstance(event, DeliveryReceived):
            self.in_flight.inc()
        elif isinstance(event, ReportPublished):
            published = self._published_by_type.get(event.report_type)
            if published is None:
                published = self.published.labels(_report_type(event.report_type))
            published.inc()
        elif isinstance(event, PublishFailed):
            self.publish_failures.labels(_report_type(event.report_type)).inc()
        elif isinstance(event, ProgressDropped):
            self.progress_dropped.labels(_one_of(event.reason, _DROP_REASONS)).inc()
        elif isinstance(event, AckFailed):
            self.ack_failures.inc()
        elif isinstance(event, CancelRequested):
            self.cancel_requests.labels(_one_of(event.result, _CANCEL_RESULTS)).inc()
        elif isinstance(event, ConsumerCancelled):
            self.consumer_cancels.labels(event.cause.value).inc()

    def _settled(self, event: DeliverySettled) -> None:
        settlement = event.settlement
        self.in_flight.dec()
        self._tasks_by_outcome[settlement.outcome].inc()
        if event.handler_ran:
            self.duration.observe(event.duration_s)
        outcome = settlement.outcome
        if outcome is Outcome.RETRY:
            self.retries.inc()
        elif outcome is Outcome.SHUTDOWN_REQUEUED:
            self.shutdown_requeued.inc()
        elif outcome is Outcome.POISON:
            self.poison.labels(_one_of(settlement.poison_reason, _POISON_REASONS)).inc()
        if settlement.reason == Reason.LEASE_LAPSED:
            self.lease_lapses.inc()
        concluded = (Outcome.FAILURE, Outcome.POISON, Outcome.CANCELLED_BY_CLIENT)
        if outcome in concluded and settlement.code is not None:
            self.failures.labels(self.code_label(settlement.code)).inc()

    def code_label(self, code: str) -> str:
        """The ``code`` label for a failure code: itself, or ``OTHER`` past the bound."""
        if code in _SDK_CODES or code in self._user_codes:
            return code
        if ERROR_CODE_PATTERN.fullmatch(code) and len(self._user_codes) < MAX_USER_CODES:
            self._user_codes.add(code)
            return code
        return OTHER_CODE

    def set_loop_lag(self, lag_s: float, component: str = LOOP_LAG_COMPONENT) -> None:
        """Record the event loop's latest lag, in seconds."""
        self.loop_lag.labels(component).set(max(0.0, lag_s))

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The metrics in the format ``accept`` asks for (Prometheus text by default).

        Returns:
            The body and its ``Content-Type``.
        """
        return exposition_of(self.registry, accept)


def exposition_of(registry: CollectorRegistry, accept: str | None = None) -> tuple[bytes, str]:
    """``registry``'s metrics in the format ``accept`` asks for, without ``*_created``.

    Returns:
        The body and its ``Content-Type`` (Prometheus text unless OpenMetrics is asked for).
    """
    # Only the media type is read from the client: the content type answered is a constant,
    # never a value copied from the request (prometheus-client would echo its version).
    collected = _WithoutCreated(registry)
    if accept and "application/openmetrics-text" in accept:
        return openmetrics.generate_latest(collected), openmetrics.CONTENT_TYPE_LATEST  # type: ignore[no-untyped-call]
    return generate_latest(collected), CONTENT_TYPE_PLAIN_0_0_4


class _WithoutCreated:
    """The registry's metrics without prometheus-client's ``*_created`` series.

    They double the series count and carry a timestamp nobody queries; dropping them here
    rather than with ``disable_created_metrics()`` leaves the application's own metrics alone.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


_POISON_REASONS: Final = frozenset(PoisonReason)
_DROP_REASONS: Final = frozenset(ProgressDropReason)
_CANCEL_RESULTS: Final = frozenset(CancelResult)
_REPORT_TYPES: Final = frozenset(ReportType)


def _one_of(value: str | None, allowed: frozenset[str]) -> str:
    return value if value is not None and value in allowed else "other"


def _report_type(value: str) -> str:
    return _one_of(value, _REPORT_TYPES)
