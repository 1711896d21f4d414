"""The worker's settings, read from environment variables by pydantic-settings.

Every duration is a float in seconds (names end in ``_s``), every size an int in bytes (``_bytes``).
docs/settings.md's table lists them all; this module is its source. Where a value comes
from, first to last: a command-line flag (:data:`SETTING_FLAGS`), the environment, a ``.env``
file in the current directory, the default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Final

from dotenv import dotenv_values
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from async_task_api_worker.broker_rules import (
    SILENT_HEARTBEATS_TO_DEAD,
    check_time_budget,
    consumer_timeout_s,
    describe_time_budget,
    split_broker_urls,
)
from async_task_api_worker.errors import SettingsError
from async_task_api_worker.protocol.encoding import MAX_REPORT_BYTES
from async_task_api_worker.setting_flags import SETTING_FLAGS, SettingFlag, flag_arguments, named

__all__ = [
    "ENV_FILE",
    "MAX_WORKER_PROCESSES",
    "SETTING_FLAGS",
    "SILENT_HEARTBEATS_TO_DEAD",
    "EventLoopKind",
    "LogFormat",
    "LogLevel",
    "SettingFlag",
    "WorkerMode",
    "WorkerSettings",
    "WorkerTransport",
    "check_time_budget",
    "consumer_timeout_s",
    "describe_time_budget",
    "flag_arguments",
    "load_settings",
    "split_broker_urls",
]

#: The most worker processes one ``run`` starts (``WORKER_PROCESSES``): a typo must not fork
#: a thousand interpreters.
MAX_WORKER_PROCESSES: Final = 128

#: The file of settings read from the current directory, below the environment.
ENV_FILE: Final = ".env"

PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeSeconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class WorkerMode(StrEnum):
    """How the process runs: a long-lived consumer, or a one-shot job with a quota."""

    SERVICE = "service"
    JOB = "job"


class WorkerTransport(StrEnum):
    """Where the deliveries come from and the reports go (``WORKER_TRANSPORT``)."""

    #: The AsyncTaskAPI platform: ``BROKER_URL``, ``IN_QUEUE_NAME``, ``OUT_QUEUE_NAME``.
    RABBITMQ = "rabbitmq"
    #: An SQS queue fed by a Step Functions ``waitForTaskToken`` state (``SQS_QUEUE_URL``,
    #: the ``aws`` extra; docs/sfn.md).
    SQS_SFN = "sqs-sfn"


class EventLoopKind(StrEnum):
    """The event loop a worker process runs on (``WORKER_EVENT_LOOP``)."""

    #: uvloop when it is installed (the ``uvloop`` extra), else asyncio's own.
    AUTO = "auto"
    ASYNCIO = "asyncio"
    #: uvloop, which must be installed; a missing one is a configuration error (exit 2).
    UVLOOP = "uvloop"


class _AnyCase(StrEnum):
    """An enum whose values are matched whatever their case (``debug`` is ``DEBUG``)."""

    @classmethod
    def _missing_(cls, value: object) -> _AnyCase | None:
        if isinstance(value, str):
            for member in cls:
                if member.value.casefold() == value.casefold():
                    return member
        return None


class LogLevel(_AnyCase):
    """The stdlib logging levels ``LOG_LEVEL`` accepts, in any case."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


class LogFormat(_AnyCase):
    """How a log record is written (``LOG_FORMAT``): one line either way, the same fields."""

    #: One JSON object per line, for log collectors.
    JSON = "json"
    #: ``ts level logger msg key=value...``, for a person reading a terminal.
    TEXT = "text"


class WorkerSettings(BaseSettings):
    """Every setting of a worker process; each field is read from the upper-cased variable.

    Construct with ``WorkerSettings()`` to read the environment, or use :func:`load_settings`
    to get a :class:`SettingsError` with a one-line message instead of pydantic's report.
    """

    model_config = SettingsConfigDict(
        case_sensitive=False,
        extra="forbid",
        frozen=True,
        validate_default=True,
        env_file=ENV_FILE,
        env_file_encoding="utf-8",
        # A .env holds the application's variables too (AWS_..., its own): only ours are read.
        dotenv_filtering="only_existing",
    )

    # --- broker -------------------------------------------------------------------------------
    worker_transport: WorkerTransport = WorkerTransport.RABBITMQ
    """``rabbitmq`` (the AsyncTaskAPI platform) or ``sqs-sfn`` (SQS + Step Functions)."""
    sqs_queue_url: Annotated[str, Field(min_length=1, max_length=2048)] | None = None
    """``sqs-sfn``: the queue the Step Functions state sends to (required then)."""
    sfn_heartbeat_interval_s: Annotated[float, Field(ge=0.1, le=3600, allow_inf_nan=False)] = 15.0
    """``sqs-sfn``: seconds between two ``SendTaskHeartbeat`` calls per task; keep it well
    under the state's ``HeartbeatSeconds``. A subprocess stops itself after two without its
    lease renewed (``broker_rules.lease_expiry_s``)."""
    sqs_wait_time_s: Annotated[int, Field(ge=0, le=20)] = 5
    """``sqs-sfn``: the SQS long poll, in whole seconds (how long an idle stop may wait)."""
    broker_url: SecretStr = SecretStr("amqp://guest:guest@localhost:5672/")
    """AMQP URL of the broker (``amqp://user:password@host:5672/vhost``), or several separated
    by commas (the nodes of a cluster, tried in turn); passwords are never logged. ``amqps://``
    for TLS, its CA, client certificate and server name as query options (docs/tls.md)."""
    broker_heartbeat_s: Annotated[int, Field(ge=1, le=600)] = 15
    """AMQP heartbeat timeout asked of the broker, in whole seconds (a URL's own
    ``?heartbeat=`` wins). The worker takes a connection for dead after two of them without a
    frame, and reports ``broker`` not ready after one; a process-isolated task stops itself
    after two without its lease renewed (``broker_rules.lease_expiry_s``)."""
    in_queue_name: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    """Queue the tasks arrive on; default ``<worker name>_queue_in``."""
    out_queue_name: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    """Queue the reports are published to; default ``<worker name>_queue_out``."""
    control_exchange_name: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    """Fanout exchange the cancel requests are published to; default ``<worker name>_control``."""
    worker_cancel_memory: Annotated[int, Field(ge=0, le=1_000_000)] = 10_000
    """How many cancel requests for tasks not running here are remembered (the oldest go
    first), so that a task whose cancel came first concludes without running; 0: none."""
    worker_cancel_memory_s: PositiveSeconds = 3600.0
    """How long such a cancel request is remembered, in seconds."""
    worker_consumer_timeout_s: PositiveSeconds = 1800.0
    """The consumer timeout, in seconds. Before RabbitMQ 4.3, the broker's ``consumer_timeout``
    (its default: 30 min), which the time budget must fit under; from 4.3 on a quorum queue,
    the timeout the worker asks for (``x-consumer-timeout``), raised to what a longer task
    needs. A report that cannot get out holds its delivery until it nears."""
    worker_consumer_timeout_check_interval_s: PositiveSeconds = 60.0
    """How often the broker checks the consumer timeout (RabbitMQ's channel tick,
    ``channel_tick_interval``: 60 s by default), in seconds: the slack kept under
    ``WORKER_CONSUMER_TIMEOUT_S``."""
    worker_max_message_bytes: Annotated[int, Field(ge=1024, le=512 * 1024 * 1024)] = (
        16 * 1024 * 1024
    )
    """Largest inbound body accepted, in bytes; a larger one is a poison message."""
    worker_max_report_bytes: Annotated[int, Field(ge=4096, le=MAX_REPORT_BYTES)] = MAX_REPORT_BYTES
    """Largest report published, in bytes (the broker's ``max_message_size``, if lower): a
    larger ``success`` is reported as a ``RESULT_TOO_LARGE`` failure."""

    # --- tasks --------------------------------------------------------------------------------
    worker_mode: WorkerMode = WorkerMode.SERVICE
    """``service`` (a long-lived consumer) or ``job`` (stop after the quota)."""
    worker_concurrency: Annotated[int, Field(ge=1, le=10_000)] = 1
    """Tasks run at once; also the prefetch (service mode) and the thread pool's size."""
    worker_processes: Annotated[int, Field(ge=1, le=MAX_WORKER_PROCESSES)] = 1
    """Worker processes ``run`` starts, each with its own connection and ``WORKER_CONCURRENCY``
    tasks; above 1 a supervisor runs them (``runtime.processes``). ``run --processes`` wins."""
    worker_task_timeout_s: PositiveSeconds | None = None
    """Overrides the ``@worker.task(timeout=...)`` of the code, in seconds."""
    worker_delivery_limit: Annotated[int, Field(ge=1, le=1000)] = 5
    """Attempts a task gets; a ``RetryableError`` on the last one concludes the task."""
    worker_acquired_limit: Annotated[int, Field(ge=1, le=10_000)] = 25
    """Hand-outs a message gets, whatever came of them (RabbitMQ 4.3+'s ``x-acquired-count``,
    which also counts what does not cost an attempt there: give-backs at shutdowns and held
    reports, consumer timeouts); one past it is abandoned. At least ``WORKER_DELIVERY_LIMIT``:
    the default gives each of the default 5 attempts 4 give-backs more."""
    worker_retry_backoff_s: NonNegativeSeconds = 1.0
    """First retry backoff, in seconds; doubles with each attempt."""
    worker_retry_backoff_max_s: NonNegativeSeconds = 30.0
    """Cap of every retry backoff, in seconds (``retry_delay_s`` included); at least
    ``WORKER_RETRY_BACKOFF_S``."""
    worker_progress_min_interval_s: NonNegativeSeconds = 1.0
    """At most one ``progress`` report per this many seconds per task."""
    worker_event_loop: EventLoopKind = EventLoopKind.AUTO
    """``auto`` (uvloop if installed), ``asyncio`` or ``uvloop`` (docs/benchmarks.md)."""

    # --- lifecycle ----------------------------------------------------------------------------
    worker_shutdown_grace_s: NonNegativeSeconds = 25.0
    """Time in-flight tasks get to finish after SIGTERM before they are requeued."""
    worker_shutdown_hooks_timeout_s: NonNegativeSeconds = 5.0
    """Time all ``on_shutdown`` hooks get together."""
    worker_job_max_deliveries: Annotated[int, Field(ge=1)] = 1
    """Job mode: deliveries taken before the job stops consuming (the quota)."""
    worker_job_idle_timeout_s: PositiveSeconds = 30.0
    """Job mode: exit 0 after this long without a delivery."""
    worker_job_connect_timeout_s: PositiveSeconds = 30.0
    """Job mode: exit 1 if the broker cannot be reached within this time."""

    # --- observability ------------------------------------------------------------------------
    health_check_host: Annotated[str, Field(min_length=1)] = "0.0.0.0"  # noqa: S104 - a pod's probe port
    """Address the probes server binds."""
    health_check_port: Annotated[int, Field(ge=0, le=65535)] = 8083
    """Port of the probes server (``/health``, ``/ready``, ``/metrics``); 0 picks a free one."""
    log_level: LogLevel = LogLevel.INFO
    """Level of the SDK's logs, in any case."""
    log_format: LogFormat = LogFormat.JSON
    """``json`` (one JSON object per line) or ``text`` (one readable line per record)."""

    @field_validator("broker_url")
    @classmethod
    def _amqp_url(cls, value: SecretStr) -> SecretStr:
        split_broker_urls(value.get_secret_value())
        return value

    @field_validator("sqs_queue_url")
    @classmethod
    def _queue_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from urllib.parse import urlsplit

        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL naming a host")
        return value.strip()

    @model_validator(mode="after")
    def _transport_needs(self) -> WorkerSettings:
        if self.worker_transport is WorkerTransport.SQS_SFN and self.sqs_queue_url is None:
            raise ValueError("SQS_QUEUE_URL: required with WORKER_TRANSPORT=sqs-sfn")
        if self.worker_transport is WorkerTransport.RABBITMQ and self.sqs_queue_url is not None:
            # Most likely a forgotten WORKER_TRANSPORT: the worker would consume RabbitMQ.
            raise ValueError("SQS_QUEUE_URL: set, but WORKER_TRANSPORT is rabbitmq (sqs-sfn?)")
        if self.worker_processes > 1 and self.worker_mode is WorkerMode.JOB:
            # A job's quota, idle exit and exit code describe one process: the pod's.
            raise ValueError(
                f"{named('WORKER_PROCESSES')}: job mode runs one process (its quota and exit "
                "code are the pod's); run one process and more jobs"
            )
        if self.worker_processes > 1 and self.worker_transport is WorkerTransport.SQS_SFN:
            # One process clearing the task's protection would expose another's message.
            raise ValueError(
                f"{named('WORKER_PROCESSES')}: sqs-sfn runs one process per ECS task (task "
                "protection is task-wide); run one process and more tasks"
            )
        if self.worker_acquired_limit < self.worker_delivery_limit:
            # Every attempt is a hand-out too: the lower limit would abandon counted attempts.
            raise ValueError(
                "WORKER_ACQUIRED_LIMIT: must be at least WORKER_DELIVERY_LIMIT (every attempt is "
                "a hand-out too; raise WORKER_ACQUIRED_LIMIT)"
            )
        if self.worker_retry_backoff_s > self.worker_retry_backoff_max_s:
            # The cap would silently win over the first backoff: say which one to change.
            raise ValueError(
                "WORKER_RETRY_BACKOFF_S: must not exceed WORKER_RETRY_BACKOFF_MAX_S (lower the "
                "first or raise the cap)"
            )
        return self

    def broker_urls(self) -> tuple[str, ...]:
        """The broker URLs of ``BROKER_URL``, in the order they are tried."""
        return split_broker_urls(self.broker_url.get_secret_value())

    def delivery_hold_s(self, timeout_s: float) -> float:
        """The longest a delivery may stay unacked before the broker may time it out, in s.

        The consumer timeout it lives under (``broker_rules.consumer_timeout_s``: the task's
        effective timeout ``timeout_s`` decides it on RabbitMQ 4.3+) less
        ``WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S``: a report that cannot get out is retried,
        holding its delivery, until then.
        """
        return max(
            0.0,
            consumer_timeout_s(self, timeout_s) - self.worker_consumer_timeout_check_interval_s,
        )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Read the constructor's values, then the environment, then ``.env``; no secrets dir."""
        return (init_settings, env_settings, dotenv_settings)

    def in_queue(self, service: str) -> str:
        """The input queue's name for the worker ``service``."""
        return self.in_queue_name or f"{service}_queue_in"

    def out_queue(self, service: str) -> str:
        """The output queue's name for the worker ``service``."""
        return self.out_queue_name or f"{service}_queue_out"

    def control_exchange(self, service: str) -> str:
        """The cancel requests' fanout exchange for the worker ``service``."""
        return self.control_exchange_name or f"{service}_control"

    def task_timeout_s(self, declared_s: float) -> float:
        """The effective task timeout: ``WORKER_TASK_TIMEOUT_S`` if set, else the declared one."""
        return self.worker_task_timeout_s if self.worker_task_timeout_s is not None else declared_s


class _ValuesOnlySettings(WorkerSettings):
    """The same settings built from given values only: no environment variable, no ``.env``."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Read the constructor's values and nothing else."""
        return (init_settings,)


def load_settings(
    values: Mapping[str, Any] | None = None, *, read_environment: bool = True
) -> WorkerSettings:
    """Build and validate the settings.

    Args:
        values: field values (``{"worker_delivery_limit": 3}``; a command line's flags); they
            win over the environment, which wins over :data:`ENV_FILE`.
        read_environment: read the environment variables and :data:`ENV_FILE` too (``False``
            in the test harness). Of the file, only the variables of these settings are read.

    Returns:
        The validated settings.

    Raises:
        SettingsError: a value is invalid or unknown (a flag is named with its variable), or
            :data:`ENV_FILE` cannot be read. The message is one line naming the variable and
            the rule it breaks, never the value (a URL may hold a password).
    """
    cls = WorkerSettings if read_environment else _ValuesOnlySettings
    try:
        return cls(**dict(values or {}))
    except UnicodeDecodeError:  # the .env file, the one file read
        raise SettingsError(f"invalid setting file {ENV_FILE}: not UTF-8 text") from None
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise SettingsError(f"invalid setting file {ENV_FILE}: cannot be read ({why})") from None
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        variable = ".".join(str(part) for part in first["loc"]).upper()
        name = named(variable)
        if read_environment and _from_env_file(variable, values):
            name = f"{name} (in {ENV_FILE})"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        rule = first["msg"].removeprefix("Value error, ")
        # A rule between settings names its variable itself ("SQS_QUEUE_URL: required ...").
        subject = f"{name}: {rule}" if name else rule
        raise SettingsError(f"invalid setting {subject}{more}") from None


def _from_env_file(variable: str, values: Mapping[str, Any] | None) -> bool:
    """Whether ``variable``'s value came from :data:`ENV_FILE` (for the error that names it)."""
    if not variable or variable.lower() in (values or {}):
        return False
    if any(name.upper() == variable for name in os.environ):
        return False
    return any(name.upper() == variable for name in dotenv_values(ENV_FILE))
