"""A task as read from its handler: the signature's rules, the isolation and the error codes.

``@worker.task`` reads its handler here (:func:`read_task`); every mistake raises its own
:class:`~async_task_api_worker.errors.DefinitionError` subclass with a one-line message.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, Literal

from pydantic import BaseModel

from async_task_api_worker.context import SyncTaskContext, TaskContext
from async_task_api_worker.errors import (
    ContextParameterError,
    ErrorDeclarationError,
    HandlerKindError,
    HandlerSignatureError,
    InputModelError,
    IsolationError,
    OutputModelError,
)
from async_task_api_worker.protocol.codes import ERROR_CODE_PATTERN, RESERVED_ERROR_CODES

__all__ = [
    "HandlerKind",
    "TaskDefinition",
    "TaskErrorHook",
    "TaskErrorInput",
    "check_importable",
    "check_isolation",
    "checked_errors",
    "qualified",
    "read_task",
]


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


@dataclass(frozen=True, slots=True)
class TaskErrorInput:
    """What ``@worker.on_task_error`` hooks get: a handler's unexpected exception and its task.

    The exception is one the SDK reported as ``INTERNAL_ERROR`` (anything but a well-formed
    ``FatalError`` or ``RetryableError``, a timeout or a cancel: ``task_call.conclude_error``
    decides). The fields are the ones the task's log lines carry, and its client id; not its
    input, which the logs never carry either (docs/protocol.md, "Payloads and secrets").

    Attributes:
        exception: the exception the handler raised, with its traceback. For a
            process-isolated task, a ``RemoteHandlerError`` naming the type the child raised
            and its frames (its message stays in the child).
        task_id: the envelope's task id.
        client_id: the envelope's client id.
        service: the worker's service name.
        attempt: this delivery's attempt, from 1.
        delivery_limit: the attempts the task gets.
    """

    exception: BaseException
    task_id: str
    client_id: str
    service: str
    attempt: int
    delivery_limit: int

    @property
    def tags(self) -> dict[str, str]:
        """The task's fields as strings, for an error tracker's tags (``service``, ...)."""
        return {
            "task_id": self.task_id,
            "client_id": self.client_id,
            "service": self.service,
            "attempt": str(self.attempt),
        }


#: An error hook: a ``def`` or an ``async def`` taking a :class:`TaskErrorInput`.
TaskErrorHook = Callable[[TaskErrorInput], object]


def qualified(function: Callable[..., Any]) -> str:
    """The function's qualified name, for messages."""
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
    name = qualified(function)
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
    if (
        context_annotation is not expected_context
        and hints.get(input_param.name) is expected_context
    ):
        raise ContextParameterError(
            f"task handler {name}: the parameters are the wrong way round: the signature is "
            f"(task_input: <a pydantic model>, ctx: {expected_context.__name__})"
        )
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


def check_isolation(isolation: object, memory_limit_bytes: object, cpu_limit_s: object) -> None:
    """Check ``isolation=`` and its limits.

    Raises:
        IsolationError: a value is not allowed, or a limit is given without isolation.
    """
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


def checked_errors(errors: object) -> Mapping[str, str]:
    """``errors=``, checked against the code rule of protocol/codes.py, as a read-only copy.

    Raises:
        ErrorDeclarationError: not a mapping, a code breaks the rule or is reserved, or a
            description is blank.
    """
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


def check_importable(function: Callable[..., Any]) -> None:
    """Check that a child process can import ``function`` by its name.

    Raises:
        IsolationError: it is a lambda or is defined inside another function.
    """
    if "<locals>" in function.__qualname__ or "<lambda>" in function.__qualname__:
        raise IsolationError(
            f"task handler {function.__qualname__} runs in a child process with "
            f'isolation="process", which finds it by name: define it at module level'
        )
