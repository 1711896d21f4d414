"""Process isolation: each task in a fresh child process, killed as a whole process group.

Cooperative cancellation cannot stop blocking code; SIGKILL to a separate process group can
(seed 000, "Subprocess cancellation is hard kill"). The child is forked by the fork server
(:mod:`.forkserver`), or spawned as a fresh interpreter when the fork server cannot serve.
The worker kills the child's whole group (grandchildren included) at the task's deadline, at
the end of the drain, and on a cancel; after the kill the child is reaped and its pipes closed,
so no read can hang on a grandchild that still holds one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import sys
import time
from typing import Any, Final

from async_task_api_worker.context import (
    ProgressDropReason,
    ProgressUpdate,
    progress_sink_of,
    task_log_extra,
)
from async_task_api_worker.definition import TaskDefinition
from async_task_api_worker.errors import (
    FatalError,
    IsolatedTaskError,
    RemoteHandlerError,
    RetryableError,
    TaskTimeoutError,
)
from async_task_api_worker.executors.process.channel import (
    MAX_CHILD_FRAME_BYTES,
    ChannelError,
    encode_frame,
    read_frame,
)
from async_task_api_worker.executors.process.forkserver import (
    ForkServer,
    ForkServerError,
    HandlerLoadError,
)
from async_task_api_worker.executors.process.group import (
    TaskProcess,
    signal_name,
    spawn_in_new_session,
)
from async_task_api_worker.executors.process.output import OutputTail
from async_task_api_worker.ports import ExecutionRequest
from async_task_api_worker.protocol.codes import ErrorCode

__all__ = ["EXIT_GRACE_S", "ProcessExecutor"]

_logger = logging.getLogger("async_task_api_worker.executors.process")

#: Seconds a child gets to exit once it has sent its answer, or once its channel has closed.
EXIT_GRACE_S: Final = 5.0
#: Seconds an answer may take to arrive once the child has exited.
ANSWER_GRACE_S: Final = 0.5
#: Seconds to wait for a killed child to be reaped.
REAP_TIMEOUT_S: Final = 5.0
#: Seconds to wait for the killed group's other processes to be reaped.
GROUP_GONE_TIMEOUT_S: Final = 1.0
#: Seconds between two attempts to restart a fork server that stopped.
RESTART_INTERVAL_S: Final = 30.0
_RESERVED_LOG_KEYS: Final = frozenset({"message", "asctime", "args", "msg", "exc_info"})


class ProcessExecutor:
    """Runs each task of ``task`` in a child process of its own (``isolation="process"``).

    Args:
        task: the worker's task (its handler must be a module-level function).
        use_fork_server: fork children from a fork server (default); ``False`` spawns a fresh
            interpreter per task.
        output_tail_bytes: bytes of the child's stdout and of its stderr kept for the log.
    """

    def __init__(
        self, task: TaskDefinition, *, use_fork_server: bool = True, output_tail_bytes: int = 16384
    ) -> None:
        self._task = task
        self._use_fork_server = use_fork_server
        self._tail_bytes = output_tail_bytes
        main = sys.modules.get("__main__")
        self._main_path: str | None = getattr(main, "__file__", None)
        self._fork_server: ForkServer | None = None
        self._restarting: asyncio.Future[None] | None = None
        self._tried = False
        self._last_start_at = -RESTART_INTERVAL_S
        self.spawned_by_fork_server = 0
        """Children forked by the fork server so far."""
        self.spawned_fresh = 0
        """Children spawned as a fresh interpreter so far."""

    @property
    def stuck_task_ids(self) -> tuple[str, ...]:
        """Always empty: a process can always be killed."""
        return ()

    async def start(self) -> None:
        """Start the fork server now, before the first task.

        A fork server that cannot start is logged, and tasks are then spawned as fresh
        interpreters.

        Raises:
            HandlerLoadError: a fresh interpreter cannot load the handler (its module fails to
                import there, or the script calls ``worker.run()`` without a ``__main__``
                guard): no task could run, so the worker does not start.
        """
        await self._start_fork_server()

    async def _start_fork_server(self) -> None:
        if not self._use_fork_server:
            return
        self._tried = True
        self._last_start_at = time.monotonic()
        server = ForkServer(self._task.handler_reference, self._main_path)
        try:
            await server.start()
        except HandlerLoadError:
            raise
        except ForkServerError as exc:
            _logger.warning(
                "The fork server cannot serve (%s): tasks start a fresh interpreter each, "
                "which is slower, until it can be started again",
                exc,
            )
            return
        old, self._fork_server = self._fork_server, server
        if old is not None:
            await old.aclose()
        _logger.info("Fork server ready for %s", self._task.handler_reference)

    def _usable_fork_server(self) -> ForkServer | None:
        """The fork server if it runs; else a restart in the background, never in a task's time."""
        if not self._use_fork_server:
            return None
        server = self._fork_server
        if server is not None and server.alive:
            return server
        due = time.monotonic() - self._last_start_at >= RESTART_INTERVAL_S
        if due and (self._restarting is None or self._restarting.done()):
            self._restarting = asyncio.ensure_future(self._restart())
        return None

    async def _restart(self) -> None:
        try:
            await self._start_fork_server()
        except HandlerLoadError as exc:
            _logger.error("The fork server cannot load the handler any more (%s)", exc)

    async def _launch(self, fds: list[int]) -> TaskProcess:
        if self._use_fork_server and not self._tried:
            await self._start_fork_server()  # not started by start(): the first task waits
        server = self._usable_fork_server()
        if server is not None:
            try:
                pid, exited = await server.spawn(fds)
            except ForkServerError as exc:
                _logger.warning("The fork server failed (%s); spawning this task instead", exc)
            else:
                self.spawned_by_fork_server += 1
                return TaskProcess(pid, exited)
        channel_fd, out_fd, err_fd = fds
        argv = [
            sys.executable,
            "-m",
            "async_task_api_worker.executors.process",
            "child",
            "--handler",
            self._task.handler_reference,
            "--channel-fd",
            str(channel_fd),
            *(["--main-path", self._main_path] if self._main_path else []),
            "--sys-path",
            json.dumps(sys.path),
        ]
        child = await spawn_in_new_session(
            argv, stdout_fd=out_fd, stderr_fd=err_fd, pass_fds=(channel_fd,)
        )
        self.spawned_fresh += 1
        return child

    def _request(self, request: ExecutionRequest) -> dict[str, Any]:
        context = request.context
        return {
            "input": dict(request.raw_input),
            "context": {
                "task_id": context.task_id,
                "client_id": context.client_id,
                "service": context.service,
                "attempt": context.attempt,
                "delivery_limit": context.delivery_limit,
                "input_refs": [ref.model_dump(mode="json") for ref in context.input_refs],
            },
            "limits": {
                "memory_limit_bytes": self._task.memory_limit_bytes,
                "cpu_limit_s": self._task.cpu_limit_s,
            },
            "log_level": logging.getLogger().getEffectiveLevel(),
        }

    async def execute(self, request: ExecutionRequest) -> Any:
        """Run the handler in a child process under ``request.timeout_s``.

        Returns:
            The handler's response, as JSON-compatible data (the engine validates it).

        Raises:
            TaskTimeoutError: the deadline passed; the child's group was killed.
            FatalError, RetryableError: the handler raised it (rebuilt from its code,
                message and retry delay).
            RemoteHandlerError: the handler raised anything else (``INTERNAL_ERROR``).
            IsolatedTaskError: the child died from a signal the SDK did not send or hit its
                memory limit (``WORKER_CRASHED``), or ended without a valid result
                (``INVALID_RESULT``).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.timeout_s
        ours, theirs = socket.socketpair()
        stdout = OutputTail("stdout", self._tail_bytes)
        stderr = OutputTail("stderr", self._tail_bytes)
        child: TaskProcess | None = None
        output_level = logging.DEBUG
        try:
            try:
                child = await self._launch([theirs.fileno(), stdout.write_fd, stderr.write_fd])
            finally:
                theirs.close()
                stdout.close_write_end()
                stderr.close_write_end()
            stdout.start()
            stderr.start()
            conversation = asyncio.ensure_future(self._converse(ours, request, child))
            exited = asyncio.ensure_future(_settled(child.exited))
            try:
                done, _ = await asyncio.wait(
                    {conversation, exited},
                    timeout=max(0.0, deadline - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if exited in done and conversation not in done:
                    # The child is gone, but a descendant may hold the channel open: its
                    # answer, if it sent one, is already in the socket.
                    done, _ = await asyncio.wait(
                        {conversation}, timeout=min(ANSWER_GRACE_S, deadline - loop.time())
                    )
                    if not done:
                        conversation.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await conversation
                        output_level = logging.WARNING
                        raise _exit_failure(child, exited.result())
            except asyncio.CancelledError:
                conversation.cancel()
                raise
            finally:
                exited.cancel()
            if not done:
                conversation.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await conversation
                raise TaskTimeoutError(f"handler ran past {request.timeout_s:g} s")
            try:
                return conversation.result()
            except IsolatedTaskError:
                # Its output is the best clue to why it died (a fatal error, a C library).
                output_level = logging.WARNING
                raise
        finally:
            await self._clean_up(child, ours, stdout, stderr, request.task_id, output_level)

    async def _clean_up(  # noqa: PLR0917 - private, called once
        self,
        child: TaskProcess | None,
        ours: socket.socket,
        stdout: OutputTail,
        stderr: OutputTail,
        task_id: str,
        output_level: int,
    ) -> None:
        ours.close()
        if child is not None:
            # Leftovers of a finished task (a grandchild in the background) go with it.
            child.kill()
            if await child.reap(REAP_TIMEOUT_S) is not None:
                await child.gone(GROUP_GONE_TIMEOUT_S)
        # The group is dead; the pipes end unless an escaped process (one that left the
        # group) still holds them: do not wait for it.
        await stdout.finish(1.0)
        await stderr.finish(1.0)
        for tail in (stdout, stderr):
            if tail.data:
                _logger.log(
                    output_level,
                    "The task's process wrote %d bytes to %s; the last ones: %s",
                    tail.total,
                    tail.name,
                    tail.text(),
                    extra=task_log_extra({"task_id": task_id}),
                )

    async def _converse(
        self, ours: socket.socket, request: ExecutionRequest, child: TaskProcess
    ) -> Any:
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        try:
            answer = await self._exchange(reader, writer, request)
        except ChannelError as exc:
            child.kill()
            if exc.too_large:
                raise IsolatedTaskError(
                    ErrorCode.RESULT_TOO_LARGE, f"the task's answer is too large: {exc}"
                ) from exc
            raise IsolatedTaskError(
                ErrorCode.INVALID_RESULT, f"the task's process broke its result channel: {exc}"
            ) from exc
        except (KeyError, TypeError, ValueError, RecursionError) as exc:
            child.kill()
            raise IsolatedTaskError(
                ErrorCode.INVALID_RESULT,
                f"the task's process broke its result channel ({type(exc).__name__})",
            ) from exc
        finally:
            writer.close()
        if answer is None:
            return await self._no_answer(child)
        await child.reap(EXIT_GRACE_S)
        return _outcome(answer)

    async def _exchange(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: ExecutionRequest
    ) -> dict[str, Any] | None:
        """Send the request, relay progress and logs; the answer, or ``None`` without one."""
        sink = progress_sink_of(request.context)
        try:
            writer.write(encode_frame(self._request(request)))
            await writer.drain()
            while True:
                message = await read_frame(reader, MAX_CHILD_FRAME_BYTES)
                if message is None:
                    return None
                kind = message.get("t")
                if kind == "progress":
                    sink.offer(_progress_update(message))
                elif kind == "drop":
                    with contextlib.suppress(ValueError):
                        sink.drop(ProgressDropReason(str(message.get("reason"))))
                elif kind == "log":
                    _relay_log(message)
                else:
                    return message
        except ConnectionError:
            return None  # the child died: its exit status tells how

    async def _no_answer(self, child: TaskProcess) -> Any:
        code = await child.reap(EXIT_GRACE_S)
        if code is None and not child.exited.done():
            child.kill()
            code = await child.reap(REAP_TIMEOUT_S)
        raise _exit_failure(child, code)

    async def aclose(self) -> None:
        """Stop the fork server (the groups of its tasks are killed with it)."""
        if self._restarting is not None and not self._restarting.done():
            self._restarting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._restarting
        server, self._fork_server = self._fork_server, None
        if server is not None:
            await server.aclose()


async def _settled(exited: asyncio.Future[int]) -> int | None:
    """The exit code, or ``None`` when it cannot be known (the fork server went away)."""
    try:
        return await asyncio.shield(exited)
    except asyncio.CancelledError:
        raise
    except Exception:
        return None


def _exit_failure(child: TaskProcess, code: int | None) -> IsolatedTaskError:
    """What a task process that ended without an answer means, from its exit code."""
    if code is None:
        _logger.error("The task's process was lost with its fork server")
        return IsolatedTaskError(
            ErrorCode.WORKER_CRASHED, "the task's process was lost (its fork server stopped)"
        )
    if code < 0 and not child.killed:
        name = signal_name(code)
        _logger.error("The task's process was killed by %s, not by the SDK", name)
        return IsolatedTaskError(
            ErrorCode.WORKER_CRASHED, f"the task's process was killed by {name}"
        )
    return IsolatedTaskError(
        ErrorCode.INVALID_RESULT, f"the task's process exited (code {code}) without a result"
    )


def _outcome(answer: dict[str, Any]) -> Any:
    kind = answer.get("t")
    if kind == "result":
        return answer.get("value")
    if kind == "invalid_result":
        raise IsolatedTaskError(ErrorCode.INVALID_RESULT, str(answer.get("message")))
    if kind == "crash":
        raise IsolatedTaskError(ErrorCode.WORKER_CRASHED, str(answer.get("message")))
    if kind == "error" and answer.get("kind") in ("fatal", "retryable"):
        try:
            if answer["kind"] == "fatal":
                raise FatalError(answer["code"], answer["message"])
            raise RetryableError(
                answer["code"], answer["message"], retry_delay_s=answer.get("retry_delay_s")
            )
        except (FatalError, RetryableError):
            raise
        except Exception:  # a code or delay the rules refuse: as an in-process handler's would
            raise RemoteHandlerError("async_task_api_worker.errors.TaskError", "") from None
    if kind == "error":
        raise RemoteHandlerError(str(answer.get("type")), str(answer.get("traceback", "")))
    raise IsolatedTaskError(ErrorCode.INVALID_RESULT, "the task's process sent no valid result")


def _progress_update(message: dict[str, Any]) -> ProgressUpdate:
    """The update a child sent, checked again: the worker trusts no message from a child.

    Raises:
        ChannelError: not a fraction in [0, 1) with a JSON object or no payload.
    """
    fraction = message.get("fraction")
    payload = message.get("payload")
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, int | float)
        or not 0.0 <= fraction < 1.0
        or not (payload is None or isinstance(payload, dict))
    ):
        raise ChannelError("a progress message that breaks the rules")
    return ProgressUpdate(float(fraction), payload)


def _relay_log(message: dict[str, Any]) -> None:
    """Log a record the child sent, as if logged here (the task fields are bound here)."""
    name = str(message.get("name") or "root")
    level = message.get("level", logging.INFO)
    extra_sent = message.get("extra") or {}
    if isinstance(level, bool) or not isinstance(level, int) or not isinstance(extra_sent, dict):
        raise ChannelError("a log message that breaks the rules")
    logger = logging.getLogger(name)
    if not logger.isEnabledFor(level):
        return
    extra = {
        str(key): value
        for key, value in extra_sent.items()
        if key not in _RESERVED_LOG_KEYS and not str(key).startswith("_")
    }
    record = logger.makeRecord(
        name, level, "(task process)", 0, str(message.get("msg", "")), (), None
    )
    for key, value in extra.items():
        if key not in record.__dict__:
            setattr(record, key, value)
    if message.get("exc"):
        record.exc_text = str(message["exc"])
    logger.handle(record)
