"""Declaring a worker: ``Worker(name)``, ``@worker.task(timeout=...)`` and the hooks.

Every mistake is caught when the decorator runs (at import of the user's module), each with its
own :class:`~async_task_api_worker.errors.DefinitionError` subclass and a one-line message. The
module is over 400 lines because those checks are one rule set, best read together.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, Literal, ParamSpec, TypeVar, overload

from pydantic import BaseModel

from async_task_api_worker.context import SyncTaskContext, TaskContext
from async_task_api_worker.errors import (
    ContextParameterError,
    DuplicateTaskError,
    ErrorDeclarationError,
    HandlerKindError,
    HandlerSignatureError,
    HookNotAsyncError,
    InputModelError,
    InvalidProbeNameError,
    InvalidTimeoutError,
    InvalidWorkerNameError,
    IsolationError,
    NoTaskError,
    OutputModelError,
)
from async_task_api_worker.protocol.codes import ERROR_CODE_PATTERN, RESERVED_ERROR_CODES
from async_task_api_worker.protocol.envelope import SERVICE_PATTERN

__all__ = ["HandlerKind", "ReadinessProbe", "TaskDefinition", "Worker", "read_task"]

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])

Hook = Callable[[], Awaitable[None]]
ReadinessProbe = Callable[[], Awaitable[bool]]

#: Component names the probes server reports itself; a user probe may not take them.
RESERVED_PROBE_NAMES: Final = frozenset({"broker", "draining"})
_PROBE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_SERVICE_RE = re.compile(SERVICE_PATTERN)


class HandlerKind(StrEnum):
    """How a handler is run: on the event loop, or in the worker's thread pool."""

    ASYNC = "async"
    SYNC = "sync"


_KIND_WORDS: Final = {
    HandlerKind.ASYNC: "an async def handler",
    HandlerKind.SYNC: "a plain def handler",
}


@dataclass(frozen=True, slots=True)
class TaskDefinition:
    """The task a worker runs, as read from its handler.

    Attributes:
        handler: the decorated function, unchanged.
        kind: ``async`` (an ``async def`` with a ``TaskContext``) or ``sync`` (a ``def`` with a
            ``SyncTaskContext``).
        input_model: the pydantic model of the task input (the first parameter's annotation).
        output_model: the pydantic model of the response (the return annotation).
        timeout_s: the declared timeout, in seconds (``WORKER_TASK_TIMEOUT_S`` overrides it).
        isolation: ``None`` (in the worker's process) or ``"process"`` (a fresh child process
            per task, killed as a whole process group).
        memory_limit_bytes: with process isolation, the address-space limit of the task's
            process (``RLIMIT_AS``), or ``None``.
        cpu_limit_s: with process isolation, the CPU time limit of the task's process
            (``RLIMIT_CPU``), in seconds, or ``None``.
        errors: the error codes the task declares it may raise, code -> what it means
            (read-only; documentation, not a limit).
    """

    handler: Callable[..., Any]
    kind: HandlerKind
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    timeout_s: float
    isolation: Literal["process"] | None = None
    memory_limit_bytes: int | None = None
    cpu_limit_s: float | None = None
    # Out of the hash only: a mapping has none, and the definition stays hashable.
    errors: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    @property
    def handler_reference(self) -> str:
        """``module:qualified.name`` of the handler, how a child process finds it."""
        return f"{self.handler.__module__}:{self.handler.__qualname__}"


def _qualified(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", repr(function))


def _model_of(annotation: object) -> type[BaseModel] | None:
    """The model class an annotation names (``Annotated`` metadata allowed), or ``None``."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def read_task(function: Callable[..., Any], timeout_s: float) -> TaskDefinition:
    """Read a task from its handler's signature (what ``@worker.task`` does).

    Raises:
        HandlerSignatureError: the handler's shape is wrong (a subclass says how).
    """
    name = _qualified(function)
    if not inspect.isfunction(function):
        raise HandlerKindError(f"task handler {name} must be a def or async def function")
    if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
        raise HandlerKindError(f"task handler {name} must return its output, not yield")
    kind = HandlerKind.ASYNC if inspect.iscoroutinefunction(function) else HandlerKind.SYNC
    parameters = list(inspect.signature(function).parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(parameters) != 2 or any(p.kind not in positional for p in parameters):
        raise HandlerSignatureError(
            f"task handler {name} must take exactly two positional parameters: (task_input, ctx)"
        )
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception as exc:  # NameError, TypeError...: whatever an annotation raises
        raise HandlerSignatureError(
            f"task handler {name} has annotations that cannot be resolved ({type(exc).__name__})"
        ) from exc
    input_param, context_param = parameters
    expected_context = TaskContext if kind is HandlerKind.ASYNC else SyncTaskContext
    context_annotation = hints.get(context_param.name)
    # An identity check on purpose: a subclass or an Annotated wrapper would hide what the SDK
    # really passes (seed, "Declaring a worker").
    if context_annotation is not expected_context:
        raise ContextParameterError(
            f"task handler {name}: parameter {context_param.name!r} must be annotated exactly "
            f"{expected_context.__name__} ({_KIND_WORDS[kind]})"
        )
    input_model = _model_of(hints.get(input_param.name))
    if input_model is None:
        raise InputModelError(
            f"task handler {name}: parameter {input_param.name!r} must be annotated with a "
            f"pydantic BaseModel subclass"
        )
    output_model = _model_of(hints.get("return"))
    if output_model is None:
        raise OutputModelError(
            f"task handler {name} must declare its return type as a pydantic BaseModel subclass"
        )
    return TaskDefinition(
        handler=function,
        kind=kind,
        input_model=input_model,
        output_model=output_model,
        timeout_s=timeout_s,
    )


def _check_isolation(isolation: object, memory_limit_bytes: object, cpu_limit_s: object) -> None:
    if isolation not in (None, "process"):
        raise IsolationError(f'isolation must be "process" or None, got {isolation!r}')
    for name, value in (("memory_limit_bytes", memory_limit_bytes), ("cpu_limit_s", cpu_limit_s)):
        if value is None:
            continue
        if isolation is None:
            raise IsolationError(f'{name} needs isolation="process"')
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
            or (name == "memory_limit_bytes" and not isinstance(value, int))
        ):
            raise IsolationError(f"{name} must be a positive number, got {value!r}")


def _checked_errors(errors: object) -> Mapping[str, str]:
    """``errors=``, checked against the code rule of protocol/codes.py, as a read-only copy."""
    if not isinstance(errors, Mapping):
        raise ErrorDeclarationError(
            f"errors must map error codes to descriptions, got {type(errors).__name__}"
        )
    for code, description in errors.items():
        if not isinstance(code, str) or not ERROR_CODE_PATTERN.fullmatch(code):
            raise ErrorDeclarationError(
                f"errors: code {code!r} does not match {ERROR_CODE_PATTERN.pattern}"
            )
        if code in RESERVED_ERROR_CODES:
            raise ErrorDeclarationError(
                f"errors: {code} is reserved for the SDK; a handler cannot raise it"
            )
        if not isinstance(description, str) or not description.strip():
            raise ErrorDeclarationError(
                f"errors: {code} needs a description, a non-blank string, got {description!r}"
            )
    return MappingProxyType(dict(errors))


def _check_importable(function: Callable[..., Any]) -> None:
    if "<locals>" in function.__qualname__ or "<lambda>" in function.__qualname__:
        raise IsolationError(
            f"task handler {function.__qualname__} runs in a child process with "
            f'isolation="process", which finds it by name: define it at module level'
        )


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
        raise HookNotAsyncError(f"{kind} hook {_qualified(function)} must be an async def function")


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
        _check_isolation(isolation, memory_limit_bytes, cpu_limit_s)
        declared = _checked_errors(errors)

        def register(function: Callable[P, R]) -> Callable[P, R]:
            if self._task is not None:
                raise DuplicateTaskError(
                    f"worker {self.name!r} already has its task "
                    f"{_qualified(self._task.handler)}; a worker runs exactly one task"
                )
            task = dataclasses.replace(read_task(function, float(timeout)), errors=declared)
            if isolation is not None:
                _check_importable(function)
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
        # The one import of a higher layer from here, kept late on purpose (the runtime
        # imports this module): .importlinter lists it as the only exception.
        from async_task_api_worker.runtime.entry import run_worker

        code = run_worker(self)
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
        from async_task_api_worker.runtime.entry import serve_worker

        await serve_worker(self)

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
    def readiness_probes(self) -> dict[str, ReadinessProbe]:
        """The readiness probes by component name."""
        return dict(self._probes)
