"""Declaring a worker: ``Worker(name)``, ``@worker.task(timeout=...)`` and the hooks.

Every mistake is caught when the decorator runs (at import of the user's module), each with its
own :class:`~async_task_api_worker.errors.DefinitionError` subclass and a one-line message
(the task's own rules are in :mod:`async_task_api_worker.task_definition`).

``worker.run()`` and ``await worker.serve()`` hand the worker to the runtime, a layer above this
one: the package wires the runtime in when it is imported (:func:`wire_runtime`), so that this
module imports nothing above it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, Literal, ParamSpec, Protocol, TypeVar, overload

from async_task_api_worker.errors import (
    DefinitionError,
    DuplicateTaskError,
    HandlerSignatureError,
    HookNotAsyncError,
    InvalidProbeNameError,
    InvalidTimeoutError,
    InvalidWorkerNameError,
    NoTaskError,
)
from async_task_api_worker.protocol.envelope import SERVICE_PATTERN
from async_task_api_worker.task_definition import (
    HandlerKind,
    TaskDefinition,
    TaskErrorHook,
    TaskErrorInput,
    check_importable,
    check_isolation,
    checked_errors,
    qualified,
    read_task,
)

__all__ = [
    "HandlerKind",
    "ReadinessProbe",
    "RuntimeEntry",
    "TaskDefinition",
    "TaskErrorHook",
    "TaskErrorInput",
    "Worker",
    "read_task",
    "wire_runtime",
]

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])

Hook = Callable[[], Awaitable[None]]
ReadinessProbe = Callable[[], Awaitable[bool]]

#: Component names the probes server reports itself; a user probe may not take them.
RESERVED_PROBE_NAMES: Final = frozenset({"broker", "draining"})
_PROBE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_SERVICE_RE = re.compile(SERVICE_PATTERN)


class RuntimeEntry(Protocol):
    """How ``Worker.run`` and ``Worker.serve`` reach the runtime (``runtime.entry``)."""

    def run(self, worker: Worker) -> int:
        """Run ``worker`` until it stops; the process's exit code."""
        ...

    async def serve(self, worker: Worker) -> None:
        """Serve ``worker`` from the running event loop until the calling task is cancelled."""
        ...


_runtime: list[RuntimeEntry] = []


def wire_runtime(entry: RuntimeEntry) -> None:
    """Give ``Worker.run`` and ``Worker.serve`` their runtime (the package does, at import)."""
    _runtime[:] = [entry]


def _the_runtime() -> RuntimeEntry:
    if not _runtime:  # pragma: no cover - the package's __init__ always wires it
        raise RuntimeError("the runtime is not wired in: import async_task_api_worker")
    return _runtime[0]


#: Set in the environment of the process-isolation fork server and of task processes.
TASK_PROCESS_ENV: Final = "ASYNC_TASK_API_WORKER_TASK_PROCESS"


def _refuse_in_task_process() -> None:
    if os.environ.get(TASK_PROCESS_ENV):
        # As multiprocessing refuses to start a process from a module being imported by one.
        raise RuntimeError(
            "worker.run() or serve() was called while a task process imported the worker's "
            'module: put the call under if __name__ == "__main__":'
        )


def _check_async(kind: str, function: Callable[..., Any]) -> None:
    if not inspect.iscoroutinefunction(function):
        raise HookNotAsyncError(f"{kind} hook {qualified(function)} must be an async def function")


class Worker:
    """A worker service: one task, its hooks and probes.

    Example::

        worker = Worker("count-words")

        @worker.task(timeout=30.0)
        async def handle(task_input: Input, ctx: TaskContext) -> Output: ...

    Args:
        name: the service name, as the envelope's ``service`` field and the default queue
            names carry it; ``^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$``.

    Raises:
        InvalidWorkerNameError: ``name`` breaks that rule.
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not _SERVICE_RE.fullmatch(name):
            raise InvalidWorkerNameError(f"worker name {name!r} must match {SERVICE_PATTERN}")
        self.name: Final = name
        self._task: TaskDefinition | None = None
        self._startup_hooks: list[Hook] = []
        self._shutdown_hooks: list[Hook] = []
        self._probes: dict[str, ReadinessProbe] = {}
        self._error_hooks: list[TaskErrorHook] = []

    def __repr__(self) -> str:
        return f"Worker({self.name!r})"

    def task(
        self,
        *misuse: object,
        timeout: float | None = None,
        isolation: Literal["process"] | None = None,
        memory_limit_bytes: int | None = None,
        cpu_limit_s: float | None = None,
        errors: Mapping[str, str] = MappingProxyType({}),
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Declare the worker's task; the decorated function is returned unchanged.

        Args:
            *misuse: nothing: present only to refuse the bare ``@worker.task`` with a clear error.
            timeout: how long the handler may run, in seconds (positive, finite). At the
                deadline an ``async def`` handler is cancelled and a ``def`` handler's thread
                abandoned; the task fails with ``TASK_TIMEOUT``. With process isolation, the
                task's whole process group is killed (SIGKILL).
            isolation: ``"process"`` runs each task in a fresh child process, in a session of
                its own, killed with its whole process group at the deadline, at the end of
                the drain, or on a cancel. The handler must be a module-level function.
            memory_limit_bytes: with process isolation, the task process's address-space
                limit (``RLIMIT_AS``, the interpreter included); hitting it is
                ``WORKER_CRASHED``.
            cpu_limit_s: with process isolation, the task process's CPU time limit
                (``RLIMIT_CPU``), in seconds; hitting it is ``WORKER_CRASHED``.
            errors: the codes the handler may raise (``FatalError``, ``RetryableError``), each
                with what it means for the client: ``{"EMPTY_TEXT": "the text is blank"}``.
                Documentation only: the ``asyncapi`` command publishes them, and raising a code
                not declared here is still allowed. Each code follows the code rule
                (``^[A-Z][A-Z0-9_]{0,63}$``) and is not reserved for the SDK.

        Raises:
            HandlerSignatureError: the decorator was used bare (``@worker.task``).
            InvalidTimeoutError: ``timeout`` is missing, or not a positive, finite number.
            IsolationError: ``isolation`` is not ``"process"`` or ``None``, a limit is given
                without process isolation or is not positive, or the handler cannot be found
                by a child process (not a module-level function).
            ErrorDeclarationError: ``errors`` is not a mapping, a code breaks the code rule or
                is reserved for the SDK, or a description is not a non-blank string.
            DuplicateTaskError: the worker already has a task.
            HandlerSignatureError: the handler's shape is wrong; the subclass says how
                (``HandlerKindError``, ``ContextParameterError``, ``InputModelError``,
                ``OutputModelError``).
        """
        if misuse:
            raise HandlerSignatureError(
                "use @worker.task(timeout=SECONDS): the decorator takes the timeout first"
            )
        if timeout is None:
            raise InvalidTimeoutError("@worker.task needs timeout=SECONDS")
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise InvalidTimeoutError(
                f"task timeout must be a positive, finite number of seconds, got {timeout!r}"
            )
        check_isolation(isolation, memory_limit_bytes, cpu_limit_s)
        declared = checked_errors(errors)

        def register(function: Callable[P, R]) -> Callable[P, R]:
            if self._task is not None:
                raise DuplicateTaskError(
                    f"worker {self.name!r} already has its task "
                    f"{qualified(self._task.handler)}; a worker runs exactly one task"
                )
            task = dataclasses.replace(read_task(function, float(timeout)), errors=declared)
            if isolation is not None:
                check_importable(function)
                task = dataclasses.replace(
                    task,
                    isolation=isolation,
                    memory_limit_bytes=memory_limit_bytes,
                    cpu_limit_s=None if cpu_limit_s is None else float(cpu_limit_s),
                )
            self._task = task
            return function

        return register

    def on_startup(self, hook: F) -> F:
        """Run ``hook()`` before consuming starts (an ``async def`` taking no argument).

        Raises:
            HookNotAsyncError: ``hook`` is not an ``async def`` function.
        """
        _check_async("on_startup", hook)
        self._startup_hooks.append(hook)
        return hook

    def on_shutdown(self, hook: F) -> F:
        """Run ``hook()`` during shutdown, after the drain (an ``async def``, no argument).

        Raises:
            HookNotAsyncError: ``hook`` is not an ``async def`` function.
        """
        _check_async("on_shutdown", hook)
        self._shutdown_hooks.append(hook)
        return hook

    def on_task_error(self, hook: F) -> F:
        """Hand each unexpected exception of the handler to ``hook`` (an error tracker's).

        ``hook(error)`` gets a :class:`~async_task_api_worker.TaskErrorInput`: the exception
        object (with its traceback) and the task's fields, for an exception the task reports
        as ``INTERNAL_ERROR``, and for no other ending. The exception's text still never
        reaches the logs nor the report. ``hook`` is a ``def`` or an ``async def``; it runs on
        a thread of its own, one call at a time, after the task concluded, so it cannot change
        the conclusion nor hold the worker up: one that raises is logged (its type and frames,
        never its text), and while one has not returned, up to 100 errors wait for it, later
        ones are dropped with a warning. A successful task costs nothing more.

        For a process-isolated task the hook runs in the worker, with a
        ``RemoteHandlerError`` that names the exception's type and frames.

        Raises:
            DefinitionError: ``hook`` is not callable.
        """
        if not callable(hook):
            raise DefinitionError(f"on_task_error hook {hook!r} must be a def or async def")
        self._error_hooks.append(hook)
        return hook

    @overload
    def readiness_probe(self, probe: F, /) -> F: ...

    @overload
    def readiness_probe(self, *, name: str) -> Callable[[F], F]: ...

    def readiness_probe(  # type: ignore[misc]  # the overloads are the public shapes
        self, probe: F | None = None, /, *, name: str | None = None
    ) -> Any:
        """Add a readiness check: ``async def probe() -> bool``, ``False`` or raising = not ready.

        Use bare (``@worker.readiness_probe``, named after the function) or with a component
        name (``@worker.readiness_probe(name="database")``); ``/ready`` names the failing ones.

        Raises:
            HookNotAsyncError: the probe is not an ``async def`` function.
            InvalidProbeNameError: the name is reserved (``broker``, ``draining``), already
                used, or not ``^[a-z][a-z0-9_-]{0,62}$``.
        """

        def register(function: F) -> F:
            _check_async("readiness_probe", function)
            component = name if name is not None else function.__name__
            if not isinstance(component, str) or not _PROBE_NAME.fullmatch(component):
                raise InvalidProbeNameError(
                    f"readiness probe name {component!r} must match {_PROBE_NAME.pattern}"
                )
            if component in RESERVED_PROBE_NAMES:
                raise InvalidProbeNameError(f"readiness probe name {component!r} is reserved")
            if component in self._probes:
                raise InvalidProbeNameError(f"readiness probe name {component!r} is already used")
            self._probes[component] = function
            return function

        return register if probe is None else register(probe)

    def run(self) -> None:
        """Run the worker on RabbitMQ until SIGTERM or SIGINT; blocks until it has stopped.

        The settings are read from the environment and checked before connecting. A non-zero
        exit code (2: configuration, 1: failure) exits the process with it
        (:class:`~async_task_api_worker.runtime.ExitCode`).

        Raises:
            SystemExit: with the exit code, when it is not 0.
            RuntimeError: called while a task process imports the worker's module (a script
                without an ``if __name__ == "__main__":`` guard).
        """
        _refuse_in_task_process()
        code = _the_runtime().run(self)
        if code:
            raise SystemExit(int(code))

    async def serve(self) -> None:
        """Serve from the running event loop until the calling task is cancelled.

        No signal handler is installed: the application owns them. Cancelling the task drains
        the worker (as SIGTERM does) before the cancel propagates.

        Raises:
            SettingsError: a setting is invalid (checked before connecting).
            BrokerRefusedError: the broker refused the connection.
            BrokerUnavailableError: the broker was lost for good.
            RuntimeError: called while a task process imports the worker's module.
        """
        _refuse_in_task_process()
        await _the_runtime().serve(self)

    @property
    def task_definition(self) -> TaskDefinition:
        """The declared task.

        Raises:
            NoTaskError: no ``@worker.task`` was declared.
        """
        if self._task is None:
            raise NoTaskError(
                f"worker {self.name!r} has no task: decorate a handler with @worker.task"
            )
        return self._task

    @property
    def startup_hooks(self) -> tuple[Hook, ...]:
        """The ``on_startup`` hooks, in declaration order."""
        return tuple(self._startup_hooks)

    @property
    def shutdown_hooks(self) -> tuple[Hook, ...]:
        """The ``on_shutdown`` hooks, in declaration order."""
        return tuple(self._shutdown_hooks)

    @property
    def task_error_hooks(self) -> tuple[TaskErrorHook, ...]:
        """The ``on_task_error`` hooks, in declaration order."""
        return tuple(self._error_hooks)

    @property
    def readiness_probes(self) -> dict[str, ReadinessProbe]:
        """The readiness probes by component name."""
        return dict(self._probes)
