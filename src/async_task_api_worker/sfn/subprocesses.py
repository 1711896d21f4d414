"""Seed 000's subprocess per message, as an executor of the engine.

``select_subprocess_module(request)`` names the module; ``python -m <module>`` runs in a session
of its own (``executors.process.group``: killed whole, reaped, its pipes drained, whatever ends
it: its deadline, a stale token, a drain), under a supervisor that kills the group if the worker
itself is killed, or stops renewing the group's lease on a pipe (:mod:`.launch`,
``executors.process.lease``; a run whose lease lapsed concludes nothing). The request travels
as seed 000 says: the raw body
in ``WORKER_REQUEST``, or, when it is 64 KiB or more, in a private file named by
``WORKER_REQUEST_FILE``. The conclusion comes back on stdout, in the one shape every child
writes (``conclusion.dump_conclusion``), read by the one reader; :func:`interpret` translates
it to seed 000's names, here alone:

| the subprocess... | conclusion |
| --- | --- |
| exits 0 with a response | a response: that object |
| ... that no report can carry (a lone surrogate: not valid Unicode) | ``INVALID_RESULT`` |
| ... with more than 1 MiB of stdout | ``RESULT_TOO_LARGE`` |
| exits 1 with a failure naming a registered class | that class's name and message |
| ... naming anything else (the framework's own names too) | ``UnknownSubprocessError`` |
| dies from a signal | ``WORKER_CRASHED`` |
| leaves anything else (not strict JSON, another exit code) | ``INVALID_RESULT`` |
| runs past its budget | ``TASK_TIMEOUT`` |

The wordings of a crash, an exit without a result and a timeout are the task call's
(``task_call``). Step Functions gets seed 000's names for the SDK codes
(:data:`SEED_ERROR_NAMES`). Its stderr
is logged redacted, at DEBUG after a normal end and WARNING when it is the clue to a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any, Final

from async_task_api_worker.conclusion import (
    Conclusion,
    Failure,
    LeaseLapsed,
    Response,
    conclusion_from_json,
)
from async_task_api_worker.executors.process.group import (
    TaskProcess,
    end_group,
    log_tails,
    signal_name,
    spawn_in_new_session,
)
from async_task_api_worker.executors.process.lease import RENEWAL, LeaseKeeper
from async_task_api_worker.executors.process.output import OutputTail
from async_task_api_worker.observability import tracing
from async_task_api_worker.ports import ExecutionRequest, Lease
from async_task_api_worker.protocol.codes import RESERVED_ERROR_CODES, ErrorCode
from async_task_api_worker.protocol.encoding import strict_loads, utf8_json
from async_task_api_worker.sfn.errors import (
    MalformedMessage,
    MalformedSubprocessOutput,
    SubprocessCrashError,
    SubprocessOutputTooLarge,
    SubprocessTimeoutError,
    UnknownSubprocessError,
    named_failure,
)
from async_task_api_worker.sfn.handler import REQUEST_ENV, REQUEST_FILE_ENV
from async_task_api_worker.sfn.levels import ExceptionLevels
from async_task_api_worker.task_call import process_ended, process_killed, sendable, task_timeout
from async_task_api_worker.transports.sqs_sfn.codec import MAX_ERROR_CHARS, MAX_OUTPUT_BYTES

__all__ = [
    "MAX_ENV_REQUEST_BYTES",
    "MAX_STDOUT_BYTES",
    "SEED_ERROR_NAMES",
    "SubprocessExecutor",
    "interpret",
]

_logger = logging.getLogger("async_task_api_worker.sfn")

#: The variables this executor sets for a subprocess: never inherited from the worker's own.
_OWN_ENV: Final = frozenset({REQUEST_ENV, REQUEST_FILE_ENV, *tracing.ENV_VARIABLES})

#: A request at least this large (UTF-8 bytes) goes in a private file, not the environment
#: (Linux refuses one environment string of 128 KiB or more).
MAX_ENV_REQUEST_BYTES: Final = 64 * 1024
#: The stdout kept for the result: room for white space around a result within the limit.
MAX_STDOUT_BYTES: Final = 4 * MAX_OUTPUT_BYTES
_STDERR_TAIL_BYTES: Final = 16384

#: The ``error`` Step Functions gets for an SDK code: seed 000's failure taxonomy.
SEED_ERROR_NAMES: Final = {
    ErrorCode.INVALID_INPUT.value: MalformedMessage.__name__,
    ErrorCode.POISON_MESSAGE.value: MalformedMessage.__name__,
    ErrorCode.TASK_TIMEOUT.value: SubprocessTimeoutError.__name__,
    ErrorCode.WORKER_CRASHED.value: SubprocessCrashError.__name__,
    ErrorCode.INVALID_RESULT.value: MalformedSubprocessOutput.__name__,
    ErrorCode.RESULT_TOO_LARGE.value: SubprocessOutputTooLarge.__name__,
}


def request_text(raw_input: dict[str, Any]) -> str:
    """The body the subprocess reads: the request as JSON text, UTF-8 where it can be."""
    return utf8_json(raw_input)


def interpret(
    code: int, stdout: OutputTail, *, levels: ExceptionLevels, module: str
) -> tuple[Conclusion, bool]:
    """What the subprocess's end means (the module's table), logged at its class's level.

    Args:
        code: the exit code (negative: the signal that killed it, never the worker's: a
            subprocess the worker kills is not interpreted).
        stdout: its stdout, read to the end.
        levels: the consumer's ``exception_levels``.
        module: the module it ran, for the log.

    Returns:
        The conclusion, and whether the end was a normal one (its stderr is then logged at
        DEBUG).
    """
    if code < 0:
        name = signal_name(code)
        levels.log(SubprocessCrashError, "%s was killed by %s", module, name)
        return process_killed(name), False
    if code == 0 and stdout.total > MAX_STDOUT_BYTES:
        levels.log(SubprocessOutputTooLarge, "%s wrote %d bytes", module, stdout.total)
        failure = Failure(
            ErrorCode.RESULT_TOO_LARGE, f"the result is over {MAX_OUTPUT_BYTES} bytes"
        )
        return failure, True
    conclusion = _conclusion(stdout.data) if code in (0, 1) else None
    if code == 0 and isinstance(conclusion, Response):
        conclusion = sendable(conclusion)  # as the report would refuse it: a lone surrogate
        if isinstance(conclusion, Failure):
            levels.log(MalformedSubprocessOutput, "%s wrote a result no report can carry", module)
        return conclusion, True
    if code == 1 and isinstance(conclusion, Failure):
        return _registered(conclusion, levels, module), True
    levels.log(MalformedSubprocessOutput, "%s exited with %s and no valid output", module, code)
    return process_ended(code), False


def _conclusion(data: bytes) -> Conclusion | None:
    try:
        document = strict_loads(data.decode("utf-8"))
        # Any code: a class name is looked up below; an SDK code (an SDK task's child,
        # ``sfn.task_child``) is a name like any other here, as seed 000 reads it.
        return conclusion_from_json(document, sdk_codes=RESERVED_ERROR_CODES, names=True)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, NaN, 1e400, not a conclusion
        return None


def _registered(failure: Failure, levels: ExceptionLevels, module: str) -> Failure:
    kind = levels.registered(failure.code)
    if kind is None:
        levels.log(UnknownSubprocessError, "%s raised an unknown %s", module, failure.code)
        return Failure(
            UnknownSubprocessError.__name__,
            f"{failure.code[:MAX_ERROR_CHARS]}: {failure.message}",
        )
    levels.log(kind, "%s raised %s", module, kind.__name__)
    return Failure(kind.__name__, failure.message)


class SubprocessExecutor:
    """Runs each message in ``python -m <module>``, the module chosen per message.

    Args:
        select: ``select_subprocess_module``: the validated request to a module name; what it
            raises fails the task (its class name and message).
        levels: the consumer's ``exception_levels``.
        python: the interpreter that runs the subprocesses.
        lease: the lease each subprocess's group holds (``None``: none).
    """

    def __init__(
        self,
        *,
        select: Callable[[Any], str],
        levels: ExceptionLevels,
        python: str = sys.executable,
        lease: Lease | None = None,
    ) -> None:
        self._select = select
        self._levels = levels
        self._python = python
        self._keeper = LeaseKeeper(lease)

    @property
    def stuck_task_ids(self) -> tuple[str, ...]:
        """Always empty: a process group can always be killed."""
        return ()

    async def start(self) -> None:
        """Nothing to prepare: each message starts an interpreter of its own."""
        return None

    async def aclose(self) -> None:
        """Stop renewing leases (each subprocess is ended with its message)."""
        await self._keeper.aclose()

    async def execute(self, request: ExecutionRequest) -> Conclusion | LeaseLapsed:
        """Route the request, run its subprocess under ``request.timeout_s``, and conclude.

        ``LeaseLapsed`` when the group's lease lapsed before the worker saw the run end.
        """
        try:
            module = self._select(request.task_input)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # SystemExit too: routing code must not end the worker
            self._levels.log(type(exc), "No subprocess for the request: %s", type(exc).__name__)
            return named_failure(exc)
        return await self._run(module, request_text(dict(request.raw_input)), request)

    async def _run(
        self, module: str, body: str, request: ExecutionRequest
    ) -> Conclusion | LeaseLapsed:
        env = {k: v for k, v in os.environ.items() if k not in _OWN_ENV}
        env.update(tracing.carrier_to_env())  # the subprocess continues the delivery's trace
        request_path: str | None = None
        if len(body.encode("utf-8")) < MAX_ENV_REQUEST_BYTES:
            env[REQUEST_ENV] = body
        else:
            fd, request_path = tempfile.mkstemp(prefix="worker-request-")  # mode 0600
            with os.fdopen(fd, "w", encoding="utf-8") as request_file:
                request_file.write(body)
            env[REQUEST_FILE_ENV] = request_path
        try:
            return await self._supervise(module, env, request)
        finally:
            if request_path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(request_path)

    async def _supervise(
        self, module: str, env: dict[str, str], request: ExecutionRequest
    ) -> Conclusion | LeaseLapsed:
        """Run ``module`` under its supervisor (:mod:`.launch`), its group holding the lease."""
        stdout = OutputTail("stdout", MAX_STDOUT_BYTES + 1)
        stderr = OutputTail("stderr", _STDERR_TAIL_BYTES)
        child: TaskProcess | None = None
        code: int | None = None
        timed_out = False
        lease: list[str] = []
        renewals: tuple[int, int] | None = None
        if self._keeper.expiry_s is not None:
            renewals = os.pipe()
            os.set_blocking(renewals[1], False)  # a renewal never waits: one byte or none
            lease = [f"--lease={renewals[0]}:{self._keeper.expiry_s!r}"]
        grant = self._keeper.grant()
        try:
            try:
                child = await spawn_in_new_session(
                    [self._python, "-m", "async_task_api_worker.sfn.launch", *lease, module],
                    env=env,
                    stdout_fd=stdout.write_fd,
                    stderr_fd=stderr.write_fd,
                    pass_fds=renewals[:1] if renewals else (),
                )
            except (OSError, ValueError) as exc:  # no such interpreter, a NUL in the module
                self._levels.log(SubprocessCrashError, "%s could not be started", module)
                return Failure(
                    ErrorCode.WORKER_CRASHED,
                    f"the subprocess could not be started ({type(exc).__name__})",
                )
            finally:
                stdout.close_write_end()
                stderr.close_write_end()
                if renewals is not None:
                    os.close(renewals[0])
            stdout.start()
            stderr.start()
            _logger.info("Running %s (pid %d, its own process group)", module, child.pid)
            if renewals is not None:
                grant.start(functools.partial(_renew, renewals[1]), child.kill)
            code = await child.reap(request.timeout_s)
            timed_out = code is None
        finally:
            self._keeper.release(grant)  # the run's end is known now
            # The whole group goes, however the message ended (a stale token, the drain's end).
            await end_group(child, (stdout, stderr))
            if renewals is not None:
                os.close(renewals[1])
            if code is None:  # past its budget (the clue is in its output), or stopped
                level = logging.WARNING if timed_out else logging.DEBUG
                log_tails((stderr,), task_id=request.task_id, level=level, logger=_logger)
        if grant.lapsed:  # whatever it concluded is void
            if code is not None:
                log_tails((stderr,), task_id=request.task_id, level=logging.DEBUG, logger=_logger)
            return LeaseLapsed()
        if code is None:
            self._levels.log(SubprocessTimeoutError, "%s ran past its time and was killed", module)
            return task_timeout(request.timeout_s)
        conclusion, normal = interpret(code, stdout, levels=self._levels, module=module)
        log_tails(
            (stderr,),
            task_id=request.task_id,
            level=logging.DEBUG if normal else logging.WARNING,
            logger=_logger,
        )
        return conclusion


def _renew(fd: int) -> None:
    """One renewal of a subprocess group's lease, on its pipe (``OSError`` when it cannot)."""
    os.write(fd, RENEWAL)
