"""Process isolation: each task in a fresh child process, killed as a whole process group.

Cooperative cancellation cannot stop blocking code; SIGKILL to a separate process group can
(seed 000, "Subprocess cancellation is hard kill"). The child is forked by the fork server
(:mod:`.forkserver`), or spawned as a fresh interpreter when the fork server cannot serve.
The worker kills the child's whole group (grandchildren too) at the task's deadline, at the
drain's end and on a cancel, then reaps it and closes its pipes (a grandchild may hold one).
With a lease (``ports.Lease``), the group stops itself when the worker stops renewing it
(:mod:`.lease`), and a run whose lease lapsed concludes nothing (``LeaseLapsed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import sys
import time
from typing import Final

from async_task_api_worker.conclusion import Conclusion, Failure, LeaseLapsed
from async_task_api_worker.context import progress_sink_of
from async_task_api_worker.definition import TaskDefinition
from async_task_api_worker.errors import IsolatedTaskError
from async_task_api_worker.executors.process.channel import (
    MAX_CHILD_FRAME_BYTES,
    ChannelError,
    DropMessage,
    LogMessage,
    OutcomeMessage,
    ProgressMessage,
    TaskRequest,
    decode_child_message,
    encode_frame,
    read_frame,
)
from async_task_api_worker.executors.process.forkserver import (
    ForkServer,
    ForkServerError,
    HandlerLoadError,
)
from async_task_api_worker.executors.process.group import (
    REAP_TIMEOUT_S,
    TaskProcess,
    end_group,
    log_tails,
    signal_name,
    spawn_in_new_session,
)
from async_task_api_worker.executors.process.lease import RENEWAL, Grant, LeaseKeeper
from async_task_api_worker.executors.process.output import OutputTail
from async_task_api_worker.ports import ExecutionRequest, Lease
from async_task_api_worker.protocol.codes import ErrorCode
from async_task_api_worker.task_call import (
    conclude_error,
    error_hooks,
    fields_of,
    process_ended,
    process_killed,
    timed_out,
)

__all__ = ["EXIT_GRACE_S", "REAP_TIMEOUT_S", "ProcessExecutor"]

_logger = logging.getLogger("async_task_api_worker.executors.process")

#: Seconds a child gets to exit once it has sent its answer, or once its channel has closed.
EXIT_GRACE_S: Final = 5.0
#: Seconds an answer may take to arrive once the child has exited.
ANSWER_GRACE_S: Final = 0.5
#: Seconds between two attempts to restart a fork server that stopped.
RESTART_INTERVAL_S: Final = 30.0


class ProcessExecutor:
    """Runs each task of ``task`` in a child process of its own (``isolation="process"``).

    Args:
        task: the worker's task (its handler must be a module-level function).
        use_fork_server: fork children from a fork server (default); ``False`` spawns a fresh
            interpreter per task.
        output_tail_bytes: bytes of the child's stdout and of its stderr kept for the log.
        lease: the lease each child's group holds (``None``: none; the runtime gives one).
    """

    def __init__(
        self,
        task: TaskDefinition,
        *,
        use_fork_server: bool = True,
        output_tail_bytes: int = 16384,
        lease: Lease | None = None,
    ) -> None:
        self._task = task
        self._keeper = LeaseKeeper(lease)
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

    def _request(self, request: ExecutionRequest) -> TaskRequest:
        return TaskRequest(
            raw_input=dict(request.raw_input),
            fields=fields_of(request.context),
            memory_limit_bytes=self._task.memory_limit_bytes,
            cpu_limit_s=self._task.cpu_limit_s,
            log_level=logging.getLogger().getEffectiveLevel(),
            lease_s=self._keeper.expiry_s,
        )

    async def execute(self, request: ExecutionRequest) -> Conclusion | LeaseLapsed:
        """Run the handler in a child process under ``request.timeout_s``.

        Returns:
            The conclusion the child's task call sent, as it is; or, when the child could not
            conclude: ``TASK_TIMEOUT`` at the deadline (the child's group killed),
            ``WORKER_CRASHED`` for a child killed by a signal the SDK did not send, and
            ``INVALID_RESULT`` (``RESULT_TOO_LARGE`` for a too large one) for a child that
            ended without a valid outcome or broke its channel. ``LeaseLapsed`` instead of any
            of them when the child's lease lapsed before the worker saw the run end.
        """
        grant = self._keeper.grant()
        try:
            return await self._execute(request, grant)
        finally:
            self._keeper.release(grant)

    async def _execute(self, request: ExecutionRequest, grant: Grant) -> Conclusion | LeaseLapsed:
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
            conversation = asyncio.ensure_future(self._converse(ours, request, child, grant))
            exited = asyncio.ensure_future(_settled(child.exited))
            try:
                done, _ = await asyncio.wait(
                    {conversation, exited},
                    timeout=max(0.0, deadline - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if exited in done and conversation not in done:
                    # Gone, but a descendant may hold the channel: its answer is in the socket.
                    done, _ = await asyncio.wait(
                        {conversation}, timeout=min(ANSWER_GRACE_S, deadline - loop.time())
                    )
                    if not done:
                        conversation.cancel()  # its end ends the grant: the run's end is known
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await conversation
                        if grant.lapsed:
                            return LeaseLapsed()
                        output_level = logging.WARNING
                        return _exit_failure(child, exited.result())
            except asyncio.CancelledError:
                conversation.cancel()
                raise
            finally:
                exited.cancel()
            if not done:
                conversation.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await conversation
                return LeaseLapsed() if grant.lapsed else timed_out(request.timeout_s)
            conclusion, ended_without_result = conversation.result()
            if ended_without_result:  # its output is the best clue to why it died
                output_level = logging.WARNING
            return conclusion
        finally:
            ours.close()
            await end_group(child, (stdout, stderr))
            log_tails((stdout, stderr), task_id=request.task_id, level=output_level, logger=_logger)

    async def _converse(
        self, ours: socket.socket, request: ExecutionRequest, child: TaskProcess, grant: Grant
    ) -> tuple[Conclusion | LeaseLapsed, bool]:
        """The child's conclusion, and whether the child ended without one of its own."""
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        broken: ChannelError | None = None
        try:
            conclusion = await self._exchange(reader, writer, request, child, grant, ours=ours)
        except ChannelError as exc:
            child.kill()
            conclusion, broken = None, exc
        finally:
            self._keeper.release(grant)  # the answer, or the channel's end, is known now
            writer.close()
        if grant.lapsed:  # whatever it concluded is void
            return LeaseLapsed(), False
        if broken is not None:
            large = broken.too_large
            code = ErrorCode.RESULT_TOO_LARGE if large else ErrorCode.INVALID_RESULT
            what = "answer is too large" if large else "process broke its result channel"
            return _no_result(code, f"the task's {what}: {broken}"), True
        if conclusion is None:
            return await self._no_answer(child), True
        await child.reap(EXIT_GRACE_S)
        return conclusion, False

    async def _exchange(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: ExecutionRequest,
        child: TaskProcess,
        grant: Grant,
        *,
        ours: socket.socket,
    ) -> Conclusion | None:
        """Send the request, relay progress and logs; the outcome, or ``None`` without one.

        Raises ``ChannelError`` when the child sends a message that breaks the channel's rules.
        """
        sink = progress_sink_of(request.context)

        def renew() -> None:  # on the socket: a broken pipe must not close the stream, unread
            with contextlib.suppress(BlockingIOError):  # full: no reader (unfenced), yet renewed
                if writer.transport.get_write_buffer_size() == 0:  # behind the whole request
                    ours.send(RENEWAL, socket.MSG_DONTWAIT)  # other OSError: the group is gone

        try:
            writer.write(encode_frame(self._request(request).to_json()))
            grant.start(renew, child.kill)
            await writer.drain()
            while True:
                frame = await read_frame(reader, MAX_CHILD_FRAME_BYTES)
                if frame is None:
                    return None
                message = decode_child_message(frame)
                if isinstance(message, ProgressMessage):
                    sink.offer(message.update)
                elif isinstance(message, DropMessage):
                    sink.drop(message.reason)
                elif isinstance(message, LogMessage):
                    message.relay()
                elif isinstance(message, OutcomeMessage):
                    error_hooks.tell(request.on_error, message.raised, request.context)
                    return message.conclusion
        except ConnectionError:
            return None  # the child died: its exit status tells how

    async def _no_answer(self, child: TaskProcess) -> Failure:
        code = await child.reap(EXIT_GRACE_S)
        if code is None and not child.exited.done():
            child.kill()
            code = await child.reap(REAP_TIMEOUT_S)
        return _exit_failure(child, code)

    async def aclose(self) -> None:
        """Stop renewing leases and stop the fork server (its tasks' groups are killed with it)."""
        await self._keeper.aclose()
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


def _no_result(code: str, message: str) -> Failure:
    """A child that ended without a conclusion of its own, concluded as the task call does."""
    return conclude_error(IsolatedTaskError(code, message))


def _exit_failure(child: TaskProcess, code: int | None) -> Failure:
    """What a task process that ended without an answer means, from its exit code.

    Raises:
        ForkServerError: its exit code is lost with its fork server (stopped, or killed by
            the worker when it stopped answering): the process went with the server, not by
            its task's fault, so the engine gives the delivery back (``engine_error``).
    """
    if code is None:
        raise ForkServerError("a task's process was lost with its fork server")
    ended = (
        process_killed(signal_name(code)) if code < 0 and not child.killed else process_ended(code)
    )
    return _no_result(ended.code, ended.message)
