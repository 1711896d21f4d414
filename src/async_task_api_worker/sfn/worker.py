"""Seed 000's ``Worker``, on the engine, the SQS + Step Functions transport and subprocesses.

Nothing here polls, handles a signal or reads a subprocess's output: the runtime runs the
worker (signals, the bounded drain, probes, metrics, JSON logs), the engine settles each
message (one decision line), the transport (``transports.sqs_sfn``) keeps seed 000's
invariants (delete on pickup under ECS task protection, heartbeats, a stale token withdraws the
message) and :mod:`.subprocesses` runs and reads the subprocess. What is left is the seed's
names: the constructor, ``run``, the request schema, the exception registry and its levels, and
the failure taxonomy's names for the SDK's codes.
"""

from __future__ import annotations

import logging
import math
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final, Generic, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from async_task_api_worker.context import SyncTaskContext
from async_task_api_worker.definition import HandlerKind, TaskDefinition
from async_task_api_worker.definition import Worker as TaskWorker
from async_task_api_worker.protocol.envelope import SERVICE_PATTERN
from async_task_api_worker.runtime.entry import prepare, run_worker, transport_for
from async_task_api_worker.runtime.runner import Runner, lease_for
from async_task_api_worker.settings import WorkerSettings
from async_task_api_worker.sfn.errors import AbortedStaleTask
from async_task_api_worker.sfn.levels import ExceptionLevels
from async_task_api_worker.sfn.request import WorkerRequest
from async_task_api_worker.sfn.subprocesses import SEED_ERROR_NAMES, SubprocessExecutor
from async_task_api_worker.transports.sqs_sfn import (
    SqsSfnTransport,
    TaskProtection,
    protection_minutes,
)
from async_task_api_worker.transports.sqs_sfn.codec import MAX_OUTPUT_BYTES
from async_task_api_worker.transports.sqs_sfn.protection import renew_period_s

__all__ = ["MAX_OUTPUT_BYTES", "Worker"]

_logger = logging.getLogger("async_task_api_worker.sfn")

RequestT = TypeVar("RequestT", bound=WorkerRequest)

#: The service name of a worker whose queue's name is not one (decision lines, metrics).
DEFAULT_SERVICE: Final = "sfn-worker"
_SERVICE_RE: Final = re.compile(SERVICE_PATTERN)


class SubprocessOutput(BaseModel):
    """Any JSON object: what a subprocess returns is forwarded as it is."""

    model_config = ConfigDict(extra="allow")


def _never_called(request: WorkerRequest, ctx: SyncTaskContext) -> SubprocessOutput:
    """The definition's handler: the subprocess executor runs a module instead."""
    raise NotImplementedError


class _SubprocessWorker(TaskWorker):
    """The engine's view of the worker: one task, whose input is the request schema."""

    def __init__(self, name: str, task: TaskDefinition) -> None:
        super().__init__(name)
        self._task = task


def service_name(queue_url: str) -> str:
    """The worker's service name: its queue's name when it is one, else ``sfn-worker``."""
    name = urlsplit(queue_url).path.rstrip("/").rpartition("/")[2]
    return name if _SERVICE_RE.fullmatch(name) else DEFAULT_SERVICE


class Worker(Generic[RequestT]):
    """A long-running SQS consumer that reports to Step Functions (``waitForTaskToken``).

    Args:
        request_schema: the parent's request model: the routing fields and ``task_token``.
        select_subprocess_module: returns the module to run for a request (``python -m``);
            what it raises fails the task (its class name is the error).
        sqs_queue_url: the queue the state machine sends to.
        heartbeat_interval_seconds: seconds between two ``SendTaskHeartbeat`` calls; keep it
            well under the state's ``HeartbeatSeconds``.
        message_processing_timeout_minutes: the budget of one message. The subprocess is
            killed (its whole group) when it passes, and the task fails with
            ``SubprocessTimeoutError``; ECS task protection is asked for this long plus one
            minute (renewed before it expires, beyond ECS's 48-hour cap).
        exception_levels: the consumer's exceptions (and, optionally, the framework's) with
            the level each is logged at. A subprocess's error name is looked up among the
            consumer's ones only.
        sqs_client: a boto3 SQS client; default: made from the environment.
        stepfunctions_client: a boto3 Step Functions client; default: made from the environment.
        protection: the ECS task protection client; default: from ``$ECS_AGENT_URI``.
        poll_wait_seconds: the SQS long poll, 0 to 20 (how long a SIGTERM may wait when idle).
        python: the interpreter that runs the subprocesses.

    Raises:
        ValueError: an empty queue URL, or a heartbeat, budget or poll out of range.

    The process's other settings (``HEALTH_CHECK_PORT``, ``LOG_LEVEL``,
    ``WORKER_SHUTDOWN_GRACE_S``...) are read from the environment when it runs (docs/sfn.md).
    """

    def __init__(
        self,
        *,
        request_schema: type[RequestT],
        select_subprocess_module: Callable[[RequestT], str],
        sqs_queue_url: str,
        heartbeat_interval_seconds: float = 15.0,
        message_processing_timeout_minutes: float = 30,
        exception_levels: Mapping[type[BaseException], int] | None = None,
        sqs_client: Any = None,
        stepfunctions_client: Any = None,
        protection: TaskProtection | None = None,
        poll_wait_seconds: int = 5,
        python: str = sys.executable,
    ) -> None:
        if not sqs_queue_url:
            raise ValueError("sqs_queue_url is empty")
        if not heartbeat_interval_seconds > 0 or not math.isfinite(heartbeat_interval_seconds):
            raise ValueError("heartbeat_interval_seconds must be a positive number")
        if not (
            message_processing_timeout_minutes > 0
            and math.isfinite(message_processing_timeout_minutes)
        ):
            raise ValueError("message_processing_timeout_minutes must be a positive number")
        if not 0 <= int(poll_wait_seconds) <= 20:
            raise ValueError("poll_wait_seconds must be 0 to 20 (SQS's long poll)")
        self._queue_url = sqs_queue_url
        self._heartbeat_s = float(heartbeat_interval_seconds)
        self._timeout_s = float(message_processing_timeout_minutes) * 60.0
        self._levels = ExceptionLevels(exception_levels)
        self._clients = (sqs_client, stepfunctions_client)
        self._protection = protection
        self._poll_wait_s = int(poll_wait_seconds)
        self._definition = _SubprocessWorker(
            service_name(sqs_queue_url),
            TaskDefinition(
                handler=_never_called,
                kind=HandlerKind.SYNC,
                input_model=request_schema,
                output_model=SubprocessOutput,
                timeout_s=self._timeout_s,
            ),
        )
        self._select = select_subprocess_module
        self._python = python
        self._runner: Runner | None = None

    @property
    def protection_minutes(self) -> int:
        """Minutes of ECS task protection asked per message (the budget plus one)."""
        return protection_minutes(self._timeout_s)

    @property
    def renew_period_s(self) -> float:
        """Seconds between two renewals of the protection: a minute before it runs out."""
        return renew_period_s(self.protection_minutes)

    def settings(self) -> WorkerSettings:
        """The process's settings: this worker's arguments, the rest from the environment.

        Raises:
            SettingsError: a setting in the environment is invalid.
        """
        return prepare(
            self._definition,
            {
                "worker_transport": "sqs-sfn",
                "sqs_queue_url": self._queue_url,
                "sfn_heartbeat_interval_s": self._heartbeat_s,
                "sqs_wait_time_s": self._poll_wait_s,
                "worker_concurrency": 1,  # one message at a time, as seed 000
                "worker_mode": "service",
                "worker_task_timeout_s": None,  # the budget is the constructor's
            },
        )

    def runner(self) -> Runner:
        """The runner of this worker (made once): engine, transport and subprocess executor.

        Raises:
            SettingsError: a setting in the environment is invalid.
        """
        if self._runner is None:
            settings = self.settings()
            transport = transport_for(
                self._definition,
                settings,
                keep_token_in_input=True,  # request_schema declares task_token
                error_names=SEED_ERROR_NAMES,
                stale_log_level=self._levels.level_of(AbortedStaleTask),
                sqs_client=self._clients[0],
                stepfunctions_client=self._clients[1],
                protection=self._protection,
            )
            executor = SubprocessExecutor(
                select=self._select,
                levels=self._levels,
                python=self._python,
                lease=lease_for(settings, transport),  # its subprocesses' groups hold it
            )
            self._runner = Runner(self._definition, settings, transport, executor=executor)
        return self._runner

    def run(self) -> None:
        """Poll and handle messages until SIGTERM or SIGINT (a message in hand finishes first).

        Exits the process with 2 and one line on stderr for an invalid setting or a queue SQS
        refuses, and with 1 when a stop fails (``runtime.ExitCode``).

        Raises:
            SystemExit: with the exit code, when it is not 0.
        """
        code = run_worker(self._definition, build=self.runner)
        if code:
            raise SystemExit(int(code))

    def request_stop(self) -> None:
        """Stop after the message in hand, if any (what SIGTERM does); from any thread."""
        if self._runner is not None:
            self._runner.request_shutdown("request_stop")

    async def handle_message(self, message: Mapping[str, Any]) -> None:
        """Handle one received SQS message: protect, delete, run, report, release.

        What the poll loop does for each message, here for one the caller received itself.
        Never raises: the outcome is the decision line.
        """
        runner = self.runner()
        transport = runner.transport
        assert isinstance(transport, SqsSfnTransport)  # noqa: S101 - made by runner()
        delivery = await transport.pick_up(message)
        if delivery is not None:  # None: a copy of a message in hand, deleted, not run twice
            await runner.engine.handle(delivery)
