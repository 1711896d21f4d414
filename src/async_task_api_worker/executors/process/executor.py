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
from async_task_api_worker.executors.process.forkserver import ForkServer, ForkServerError
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
        self._starting: asyncio.Lock | None = None
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
        """Start the fork server now (else at the first task).

        A failure is logged, and tasks are then spawned as fresh interpreters.
        """
        await self._ensure_fork_server()

    async def _ensure_fork_server(self) -> ForkServer | None:
        if not self._use_fork_server:
            return None
        if self._fork_server is not None and self._fork_server.alive:
            return self._fork_server
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._fork_server is not None and self._fork_server.alive:
                return self._fork_server
            if time.monotonic() - self._last_start_at < RESTART_INTERVAL_S:
                return None
            self._last_start_at = time.monotonic()
            server = ForkServer(self._task.handler_reference, self._main_path)
            try:
                await server.start()
            except ForkServerError as exc:
                _logger.warning(
                    "The fork server cannot serve (%s): each task now starts a fresh "
                    "interpreter, which is slower",
                    exc,
                )
                return None
            self._fork_server = server
            _logger.info("Fork server ready for %s", self._task.handler_reference)
            return server

    async def _launch(self, fds: list[int]) -> TaskProcess:
        server = await self._ensure_fork_server()
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
            try:
                done, _ = await asyncio.wait(
                    {conversation}, timeout=max(0.0, deadline - loop.time())
                )
            except asyncio.CancelledError:
                conversation.cancel()
                raise
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
        except (ChannelError, KeyError, TypeError, ValueError) as exc:
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
                    sink.offer(ProgressUpdate(float(message["fraction"]), message.get("payload")))
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
        if code is None:
            child.kill()
            code = await child.reap(REAP_TIMEOUT_S)
        if code is not None and code < 0 and not child.killed:
            name = signal_name(code)
            _logger.error("The task's process was killed by %s, not by the SDK", name)
            raise IsolatedTaskError(
                ErrorCode.WORKER_CRASHED, f"the task's process was killed by {name}"
            )
        raise IsolatedTaskError(
            ErrorCode.INVALID_RESULT,
            f"the task's process exited (code {code}) without a result",
        )

    async def aclose(self) -> None:
        """Stop the fork server (the groups of its tasks are killed with it)."""
        server, self._fork_server = self._fork_server, None
        if server is not None:
            await server.aclose()


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


def _relay_log(message: dict[str, Any]) -> None:
    """Log a record the child sent, as if logged here (the task fields are bound here)."""
    name = str(message.get("name") or "root")
    level = int(message.get("level", logging.INFO))
    logger = logging.getLogger(name)
    if not logger.isEnabledFor(level):
        return
    extra = {
        key: value
        for key, value in (message.get("extra") or {}).items()
        if key not in _RESERVED_LOG_KEYS
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
