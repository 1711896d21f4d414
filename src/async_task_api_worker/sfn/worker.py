"""The parent side: poll SQS, protect the ECS task, run a subprocess per message, report to SFN.

Seed 000, "Architecture" and "Key invariants": Step Functions is the sole retry source (a
message is deleted as soon as it is picked up, protection held); each message runs in a fresh
subprocess in its own process group, killed whole (SIGKILL) when a heartbeat finds the task
token stale or the message's time is up; heartbeats run beside the subprocess, never blocked by
it; protection wraps the handling, so SIGTERM during a message waits for the next loop.

The module is over 400 lines: seed 000 makes the parent one class and one extractable unit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping
from typing import Any, Final, Generic, TypeVar

from pydantic import ValidationError

from async_task_api_worker.executors.process.group import (
    TaskProcess,
    signal_name,
    spawn_in_new_session,
)
from async_task_api_worker.executors.process.output import OutputTail
from async_task_api_worker.sfn._aws import StepFunctionsClient, make_clients
from async_task_api_worker.sfn.errors import (
    FRAMEWORK_EXCEPTIONS,
    AbortedStaleTask,
    MalformedMessage,
    MalformedSubprocessOutput,
    SubprocessCrashError,
    SubprocessOutputTooLarge,
    SubprocessTimeoutError,
    UnknownSubprocessError,
)
from async_task_api_worker.sfn.handler import REQUEST_ENV, REQUEST_FILE_ENV
from async_task_api_worker.sfn.protection import MAX_EXPIRES_IN_MINUTES, TaskProtection
from async_task_api_worker.sfn.request import (
    ErrorOutput,
    WorkerRequest,
    describe_validation_error,
)

__all__ = ["MAX_OUTPUT_BYTES", "Worker"]

_logger = logging.getLogger("async_task_api_worker.sfn")

RequestT = TypeVar("RequestT", bound=WorkerRequest)

#: Step Functions' limit on a task's output (and on ``SendTaskSuccess``'s ``output``), bytes.
MAX_OUTPUT_BYTES: Final = 256 * 1024
#: ``SendTaskFailure`` limits, in characters.
MAX_ERROR_CHARS: Final = 256
MAX_CAUSE_CHARS: Final = 32768
#: A request at least this large (UTF-8 bytes) goes in a private file, not the environment
#: (Linux refuses one environment string of 128 KiB or more).
MAX_ENV_REQUEST_BYTES: Final = 64 * 1024
#: Error codes of a heartbeat for a token Step Functions no longer waits on.
STALE_TOKEN_CODES: Final = frozenset({"TaskTimedOut", "InvalidToken", "TaskDoesNotExist"})
_STDERR_TAIL_BYTES: Final = 16384


def _fits_environment(body: str) -> bool:
    try:
        size = len(body.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate cannot be passed to exec
        return False
    return size < MAX_ENV_REQUEST_BYTES and "\x00" not in body


def _token_of(body: str) -> str | None:
    try:
        document = json.loads(body)
    except ValueError:
        return None
    token = document.get("task_token") if isinstance(document, dict) else None
    return token if isinstance(token, str) and token.strip() else None


def _strict_object(text: str) -> dict[str, Any] | None:
    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        value = json.loads(text, parse_constant=refuse)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


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
        sqs_client, stepfunctions_client: boto3 clients; default: made from the environment.
        protection: the ECS task protection client; default: from ``$ECS_AGENT_URI``.
        poll_wait_seconds: the SQS long poll (how long a SIGTERM may wait when idle).
        python: the interpreter that runs the subprocesses.
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
        self._schema = request_schema
        self._select = select_subprocess_module
        self._queue_url = sqs_queue_url
        self._heartbeat_s = float(heartbeat_interval_seconds)
        self._timeout_s = float(message_processing_timeout_minutes) * 60.0
        self._levels: dict[type[BaseException], int] = dict(exception_levels or {})
        # Built once: a subprocess can name a consumer exception, never a framework one.
        self._subprocess_exception_for_name = {
            kind.__name__: kind
            for kind in self._levels
            if not any(issubclass(kind, own) for own in FRAMEWORK_EXCEPTIONS)
        }
        self._clients = (sqs_client, stepfunctions_client)
        self._protection = protection
        self._poll_wait_s = int(poll_wait_seconds)
        self._python = python
        self._stopping = False
        self._sqs: Any = None
        self._sfn: StepFunctionsClient | None = None

    @property
    def protection_minutes(self) -> int:
        """Minutes of ECS task protection asked per message (the budget plus one)."""
        return min(MAX_EXPIRES_IN_MINUTES, math.ceil(self._timeout_s / 60.0) + 1)

    def run(self) -> None:
        """Poll and handle messages until SIGTERM or SIGINT (a message in hand finishes first).

        Raises:
            ImportError: boto3 is missing (install ``async-task-api-worker[aws]``).
        """
        asyncio.run(self._run())

    def request_stop(self) -> None:
        """Stop after the message in hand, if any (what SIGTERM does)."""
        if not self._stopping:
            _logger.info("Stop requested: finishing the message in hand, if any")
        self._stopping = True

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(number, self.request_stop)
        try:
            self._connect()
            _logger.info("Polling %s", self._queue_url)
            while not self._stopping:
                messages = await self._receive()
                for message in messages:
                    await self.handle_message(message)
        finally:
            for number in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(number)
        _logger.info("Stopped")

    def _connect(self) -> None:
        if self._sqs is None or self._sfn is None:
            sqs, sfn = make_clients(*self._clients)
            self._sqs, self._sfn = sqs, StepFunctionsClient(sfn)
        if self._protection is None:
            self._protection = TaskProtection()

    async def _receive(self) -> list[dict[str, Any]]:
        try:
            answer = await asyncio.to_thread(
                self._sqs.receive_message,
                QueueUrl=self._queue_url,
                MaxNumberOfMessages=1,
                WaitTimeSeconds=self._poll_wait_s,
            )
        except Exception as exc:
            _logger.warning("Receiving from SQS failed (%s); retrying", type(exc).__name__)
            await asyncio.sleep(1.0)
            return []
        return list(answer.get("Messages", []))

    async def handle_message(self, message: Mapping[str, Any]) -> None:
        """Handle one SQS message: protect, delete, run, report, unprotect. Never raises."""
        self._connect()
        assert self._protection is not None  # noqa: S101 - set by _connect
        protection = self._protection
        renewing = None
        if protection.enabled:
            await asyncio.to_thread(protection.enable, self.protection_minutes)
            renewing = asyncio.ensure_future(self._renew_protection())
        try:
            await self._delete(message)
            await self._process(str(message.get("Body", "")))
        except Exception:
            _logger.exception("The worker failed on a message")
        finally:
            if renewing is not None:
                renewing.cancel()
            if protection.enabled:
                await asyncio.to_thread(protection.disable)

    @property
    def renew_period_s(self) -> float:
        """Seconds between two renewals of the protection: a minute before it runs out."""
        return max(60.0, (self.protection_minutes - 1) * 60.0)

    async def _renew_protection(self) -> None:
        assert self._protection is not None  # noqa: S101
        while True:
            await asyncio.sleep(self.renew_period_s)
            await asyncio.to_thread(self._protection.enable, self.protection_minutes)

    async def _delete(self, message: Mapping[str, Any]) -> None:
        # Delete-on-pickup: Step Functions, not SQS, retries (seed 000, invariants 1 and 2).
        try:
            await asyncio.to_thread(
                self._sqs.delete_message,
                QueueUrl=self._queue_url,
                ReceiptHandle=message["ReceiptHandle"],
            )
        except Exception as exc:
            _logger.warning(
                "Could not delete the message (%s); it may be delivered again",
                type(exc).__name__,
            )

    def _log(self, kind: type[BaseException], message: str, *args: object) -> None:
        # The most specific registered class wins (the first in the exception's MRO).
        level = next(
            (self._levels[known] for known in kind.__mro__ if known in self._levels),
            logging.ERROR,
        )
        _logger.log(level, message, *args, extra={"error": kind.__name__})

    async def _process(self, body: str) -> None:
        try:
            request = self._schema.model_validate_json(body)
        except ValidationError as exc:
            token = _token_of(body)
            self._log(
                MalformedMessage,
                "Malformed message (%s); %s",
                describe_validation_error(exc),
                "failing its task" if token else "no task token to report to",
            )
            if token:
                await self._fail(token, MalformedMessage.__name__, describe_validation_error(exc))
            return
        token = request.task_token
        try:
            module = self._select(request)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # SystemExit too: routing code must not end the worker
            self._log(type(exc), "No subprocess for the request: %s", type(exc).__name__)
            await self._fail(token, type(exc).__name__, str(exc))
            return
        await self._run_subprocess(module, body, token)

    async def _run_subprocess(self, module: str, body: str, token: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in (REQUEST_ENV, REQUEST_FILE_ENV)}
        request_path: str | None = None
        if _fits_environment(body):
            env[REQUEST_ENV] = body
        else:
            fd, request_path = tempfile.mkstemp(prefix="worker-request-")  # mode 0600
            with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass") as request_file:
                request_file.write(body)
            env[REQUEST_FILE_ENV] = request_path
        # Room for whitespace around a result that is within the limit once compacted.
        stdout = OutputTail("stdout", 4 * MAX_OUTPUT_BYTES + 1)
        stderr = OutputTail("stderr", _STDERR_TAIL_BYTES)
        stale = asyncio.Event()
        child: TaskProcess | None = None
        heartbeat = None
        code: int | None = None
        timed_out = False
        try:
            try:
                child = await spawn_in_new_session(
                    [self._python, "-m", module],
                    env=env,
                    stdout_fd=stdout.write_fd,
                    stderr_fd=stderr.write_fd,
                )
            except (OSError, ValueError) as exc:  # no such interpreter, a NUL in the module
                self._log(SubprocessCrashError, "%s could not be started", module)
                await self._fail(
                    token,
                    SubprocessCrashError.__name__,
                    f"the subprocess could not be started ({type(exc).__name__})",
                )
                return
            finally:
                stdout.close_write_end()
                stderr.close_write_end()
            stdout.start()
            stderr.start()
            _logger.info("Running %s (pid %d, its own process group)", module, child.pid)
            heartbeat = asyncio.ensure_future(self._heartbeat(token, child, stale))
            code = await child.reap(self._timeout_s)
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
            if child is not None:
                timed_out = code is None and not stale.is_set()
                child.kill()  # always: a grandchild left behind goes with its task
                code = await child.reap(5.0) if code is None else code
                await child.gone(1.0)
            await stdout.finish(1.0)
            await stderr.finish(1.0)
            if request_path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(request_path)
        if stderr.data:
            _logger.info(
                "The subprocess's stderr (last %d bytes): %s", len(stderr.data), stderr.text()
            )
        if stale.is_set():
            self._log(AbortedStaleTask, "The task token went stale: %s was killed", module)
            return
        await self._conclude(token, module, code, stdout, timed_out=timed_out)

    async def _conclude(
        self, token: str, module: str, code: int | None, stdout: OutputTail, *, timed_out: bool
    ) -> None:
        if timed_out:
            self._log(SubprocessTimeoutError, "%s ran past its time and was killed", module)
            await self._fail(
                token,
                SubprocessTimeoutError.__name__,
                f"the subprocess ran past {self._timeout_s / 60:g} minutes and was killed",
            )
            return
        if code is not None and code < 0:
            name = signal_name(code)
            self._log(SubprocessCrashError, "%s was killed by %s", module, name)
            await self._fail(token, SubprocessCrashError.__name__, f"killed by {name}")
            return
        text = stdout.data.decode("utf-8", "replace")
        if code == 0 and stdout.total <= 4 * MAX_OUTPUT_BYTES:
            output = _strict_object(text)
            compact = None
            if output is not None:
                with contextlib.suppress(ValueError):  # 1e400 parses to inf: not JSON
                    compact = json.dumps(
                        output, ensure_ascii=False, separators=(",", ":"), allow_nan=False
                    )
            if compact is not None and len(compact.encode()) <= MAX_OUTPUT_BYTES:
                await self._succeed(token, compact)
                return
            if compact is not None:
                size = len(compact.encode())
                self._log(SubprocessOutputTooLarge, "%s's result is %d bytes", module, size)
                await self._fail(
                    token,
                    SubprocessOutputTooLarge.__name__,
                    f"the result is {size} bytes; Step Functions takes {MAX_OUTPUT_BYTES}",
                )
                return
        elif code == 0:
            self._log(SubprocessOutputTooLarge, "%s wrote %d bytes", module, stdout.total)
            await self._fail(
                token,
                SubprocessOutputTooLarge.__name__,
                f"the result is over {MAX_OUTPUT_BYTES} bytes",
            )
            return
        elif code == 1:
            document = _strict_object(text)
            try:
                envelope = ErrorOutput.model_validate(document)
            except ValidationError:
                envelope = None
            if envelope is not None:
                await self._fail_from_subprocess(token, module, envelope)
                return
        self._log(MalformedSubprocessOutput, "%s exited with %s and no valid output", module, code)
        await self._fail(
            token,
            MalformedSubprocessOutput.__name__,
            f"the subprocess exited with code {code} without a valid result",
        )

    async def _fail_from_subprocess(self, token: str, module: str, envelope: ErrorOutput) -> None:
        kind = self._subprocess_exception_for_name.get(envelope.error)
        if kind is None:
            self._log(UnknownSubprocessError, "%s raised an unknown %s", module, envelope.error)
            await self._fail(
                token,
                UnknownSubprocessError.__name__,
                f"{envelope.error[:MAX_ERROR_CHARS]}: {envelope.message}",
            )
            return
        self._log(kind, "%s raised %s", module, kind.__name__)
        await self._fail(token, kind.__name__, envelope.message)

    async def _heartbeat(self, token: str, child: TaskProcess, stale: asyncio.Event) -> None:
        assert self._sfn is not None  # noqa: S101
        while True:
            await asyncio.sleep(self._heartbeat_s)
            code = await asyncio.to_thread(self._sfn.heartbeat, token)
            if code in STALE_TOKEN_CODES:
                # Step Functions has moved on: the work is wasted, and its whole tree goes.
                stale.set()
                child.kill()
                return

    async def _succeed(self, token: str, output: str) -> None:
        assert self._sfn is not None  # noqa: S101
        await asyncio.to_thread(self._sfn.succeed, token, output)

    async def _fail(self, token: str, error: str, cause: str) -> None:
        assert self._sfn is not None  # noqa: S101
        await asyncio.to_thread(
            self._sfn.fail, token, error[:MAX_ERROR_CHARS], cause[:MAX_CAUSE_CHARS]
        )
