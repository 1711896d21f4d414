"""The fork server: a single-threaded process that has imported the handler and forks per task.

Why: a fresh interpreter that imports pydantic and the worker's module costs tens of
milliseconds per task; a fork of a process that already has them costs about one. The server
is a fresh interpreter itself (started with ``python -m``), never a fork of the worker, whose
threads (the event loop's executor, a ``def`` handler's pool) would make forking it unsafe.

Control protocol, over a ``SOCK_SEQPACKET`` Unix socket (one message per packet, JSON):

- worker → server: the set-up ``{"handler", "main_path", "sys_path"}``; then one
  ``{"id": n}`` per task, with three file descriptors attached (``SCM_RIGHTS``): the task
  channel, and the write ends of the child's stdout and stderr pipes;
- server → worker: ``{"ready": true}`` (or ``{"ready": false, "error"}``); then
  ``{"id": n, "pid": p}`` once the child is forked, and ``{"pid": p, "status": s}`` (the raw
  wait status) once it is reaped.

The child calls ``setsid()`` first thing, so its pid is its process group id: the worker
records it from the reply and kills the group with it, never looking it up again. When the
worker goes away (the control socket reaches its end), the server kills every task's group
and exits, so a worker killed with SIGKILL leaves no task running.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
from typing import Any, Final

from async_task_api_worker.definition import TASK_PROCESS_ENV, TaskDefinition, read_task
from async_task_api_worker.errors import ConfigError
from async_task_api_worker.executors.process.child import (
    become_subreaper,
    die_with_parent,
    load_handler,
    serve_one,
)
from async_task_api_worker.observability.redaction import exception_type_name

__all__ = ["ForkServer", "ForkServerError", "HandlerLoadError"]

_logger = logging.getLogger("async_task_api_worker.executors.process")

#: Seconds the server gets to import the worker's module and say it is ready.
START_TIMEOUT_S: Final = 120.0
#: Seconds a fork request may take to be answered (a fork takes milliseconds; a server that
#: needs more is stuck, and is replaced).
SPAWN_TIMEOUT_S: Final = 2.0
_PACKET: Final = 65536


class ForkServerError(Exception):
    """The fork server could not start, or stopped answering."""


class HandlerLoadError(ForkServerError, ConfigError):
    """A fresh interpreter cannot load the handler: no task process could run it."""


# ---------------------------------------------------------------------------- the server


def _child(
    fds: list[int], control: socket.socket, task: TaskDefinition, private: tuple[int, ...]
) -> None:
    """In the forked child: become a session leader, wire stdout/stderr, serve, exit."""
    code = 70
    try:
        os.setsid()
        die_with_parent()
        signal.set_wakeup_fd(-1)
        for number in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_DFL)
        control.close()
        for fd in private:  # the server's own pipe: a task must not read or hold it
            os.close(fd)
        channel_fd, out_fd, err_fd = fds
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.close(out_fd)
        os.close(err_fd)
        code = serve_one(channel_fd, task)
    finally:
        os._exit(code)


def _serve(control: socket.socket, task: TaskDefinition) -> None:
    become_subreaper()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd fires
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ, "control")
    selector.register(wake_read, selectors.EVENT_READ, "wake")
    children: set[int] = set()

    def reap() -> None:
        # Orphaned grandchildren are ours too (a subreaper): reap them, report the children.
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in children:
                children.discard(pid)
                with contextlib.suppress(OSError):
                    control.send(json.dumps({"pid": pid, "status": status}).encode())

    try:
        while True:
            for key, _ in selector.select():
                if key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_read, 4096)
                    reap()
                    continue
                message, fds, _, _ = socket.recv_fds(control, _PACKET, 3)
                if not message:
                    return  # the worker is gone
                request = json.loads(message)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    _child(fds, control, task, (wake_read, wake_write))
                for fd in fds:
                    os.close(fd)
                children.add(pid)
                control.send(json.dumps({"id": request["id"], "pid": pid}).encode())
                reap()
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        for pid in children:  # only ours: a process that left its group is not waited for
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)


def main(arguments: list[str]) -> None:
    """Entry point: ``python -m async_task_api_worker.executors.process forkserver FD``."""
    os.environ[TASK_PROCESS_ENV] = "1"
    # Signals sent to the worker's terminal group are the worker's business: the server ends
    # when its control socket does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    control = socket.socket(fileno=int(arguments[0]))
    try:
        set_up = json.loads(control.recv(_PACKET))
    except (OSError, ValueError):
        return  # the worker died before it sent the set-up: nothing to serve
    sys.path[:0] = [p for p in set_up["sys_path"] if p not in sys.path]
    try:
        task = read_task(load_handler(set_up["handler"], set_up.get("main_path")), 1.0)
    except BaseException as exc:
        control.send(json.dumps({"ready": False, "error": exception_type_name(exc)}).encode())
        sys.exit(1)
    control.send(json.dumps({"ready": True}).encode())
    # What is loaded now is shared with every child: keep the collector from touching (and so
    # copying) those pages in each of them.
    gc.freeze()
    try:
        _serve(control, task)
    except OSError:
        # The worker died (kill -9, the OOM killer): its end of the control socket is gone.
        # The server's children are killed on the way out; there is nobody to tell.
        return


# ---------------------------------------------------------------------------- the client


class ForkServer:
    """The worker's handle on its fork server (one per process-isolated worker).

    Args:
        handler_reference: ``module:qualified.name`` of the handler.
        main_path: the worker's ``__main__`` script, for a handler defined there.
    """

    def __init__(self, handler_reference: str, main_path: str | None) -> None:
        self._reference = handler_reference
        self._main_path = main_path
        self._process: asyncio.subprocess.Process | None = None
        self._control: socket.socket | None = None
        self._next_id = 0
        self._spawning: dict[int, asyncio.Future[int]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self.alive = False

    async def start(self) -> None:
        """Start the server and wait until it has imported the handler.

        Raises:
            ForkServerError: it could not start, or could not import the handler.
        """
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "async_task_api_worker.executors.process",
                "forkserver",
                str(theirs.fileno()),
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=sys.stderr.fileno(),  # the worker's stdout is its JSON log stream
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise ForkServerError(f"cannot start the fork server ({exc.strerror})") from exc
        finally:
            theirs.close()
        ours.setblocking(False)
        self._control = ours
        self._ready = loop.create_future()
        loop.add_reader(ours.fileno(), self._on_readable)
        set_up = {"handler": self._reference, "main_path": self._main_path, "sys_path": sys.path}
        ours.send(json.dumps(set_up).encode())
        try:
            answer = await asyncio.wait_for(asyncio.shield(self._ready), START_TIMEOUT_S)
        except (TimeoutError, ForkServerError) as exc:
            await self.aclose()
            raise ForkServerError(f"the fork server did not start ({exc})") from exc
        if not answer.get("ready"):
            await self.aclose()
            raise HandlerLoadError(
                f"a task process cannot load the handler {self._reference} "
                f"({answer.get('error')}): it must import in a fresh interpreter"
            )
        self.alive = True

    async def spawn(self, fds: list[int]) -> tuple[int, asyncio.Future[int]]:
        """Fork a task child with ``fds`` (channel, stdout, stderr).

        Returns:
            The child's pid (also its process group id) and a future of its exit code
            (negative: killed by that signal, as ``subprocess`` reports it).

        Raises:
            ForkServerError: the server is gone or did not answer in time.
        """
        control = self._control
        if control is None or not self.alive:
            raise ForkServerError("the fork server is not running")
        self._next_id += 1
        request_id = self._next_id
        forked: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._spawning[request_id] = forked
        try:
            socket.send_fds(control, [json.dumps({"id": request_id}).encode()], fds)
            pid = await asyncio.wait_for(asyncio.shield(forked), SPAWN_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            self._spawning.pop(request_id, None)
            self._fail(f"the fork server did not fork ({type(exc).__name__})")
            raise ForkServerError("the fork server did not answer") from exc
        return pid, self._exits[pid]

    def _on_readable(self) -> None:
        control = self._control
        while control is not None:
            try:
                packet = control.recv(_PACKET)
            except BlockingIOError:
                return
            except OSError:
                packet = b""
            if not packet:
                self._fail("the fork server stopped")
                return
            self._dispatch(json.loads(packet))

    def _dispatch(self, message: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        if "ready" in message:
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(message)
        elif "id" in message:
            pid = int(message["pid"])
            self._exits[pid] = loop.create_future()
            forked = self._spawning.pop(int(message["id"]), None)
            if forked is not None and not forked.done():
                forked.set_result(pid)
        else:
            exited = self._exits.pop(int(message["pid"]), None)
            if exited is not None and not exited.done():
                exited.set_result(os.waitstatus_to_exitcode(int(message["status"])))

    def _fail(self, why: str) -> None:
        if self.alive:
            _logger.warning("The fork server stopped (%s); it is started again when needed", why)
        self.alive = False
        if self._process is not None and self._process.returncode is None:
            # Stuck, or half dead: kill it (its task processes die with it).
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
        error = ForkServerError(why)
        for future in [*self._spawning.values(), *self._exits.values()]:
            if not future.done():
                future.set_exception(error)
                # Whoever waits on it sees the error; nobody waiting is no error to report.
                future.add_done_callback(_retrieved)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(error)
        self._spawning.clear()
        self._exits.clear()
        self._close_control()

    def _close_control(self) -> None:
        control, self._control = self._control, None
        if control is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(control.fileno())
            control.close()

    async def aclose(self) -> None:
        """Stop the server: its tasks' groups are killed; it is waited for (at most 5 s)."""
        self.alive = False
        self._close_control()
        process, self._process = self._process, None
        if process is None:
            return
        try:
            await asyncio.wait_for(process.wait(), timeout=5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
