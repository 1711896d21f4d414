"""What a handler call concludes, and the one wording of each end the SDK itself gives it.

Every face concludes here: a return value (:func:`conclude_value`), a raised exception
(:func:`conclude_error`), a deadline passed (:func:`task_timeout`), a child process killed or
ended without an answer (:func:`process_killed`, :func:`process_ended`), a response that cannot
be reported (:func:`unreportable`). A face never words one of them itself, so the same end
reads the same wherever the handler ran.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel, TypeAdapter, ValidationError

from async_task_api_worker.conclusion import Conclusion, Failure, Response
from async_task_api_worker.definition import TaskDefinition
from async_task_api_worker.errors import (
    InvalidErrorCodeError,
    IsolatedTaskError,
    ReportEncodeError,
    TaskCancelledError,
    TaskError,
    TaskTimeoutError,
    is_well_formed,
)
from async_task_api_worker.observability.redaction import exception_type_name, safe_traceback
from async_task_api_worker.protocol.cancel import TASK_CANCELLED_MESSAGE
from async_task_api_worker.protocol.codes import ErrorCode
from async_task_api_worker.protocol.encoding import (
    canonical_dumps,
    check_tree,
    lone_surrogate,
    refuse_lone_surrogate,
)
from async_task_api_worker.protocol.envelope import describe_validation_error, model_field_names

__all__ = [
    "CANCELLED_BY_CLIENT",
    "INTERNAL_ERROR_MESSAGE",
    "conclude_error",
    "conclude_value",
    "invalid_input",
    "process_ended",
    "process_killed",
    "sendable",
    "task_timeout",
    "timed_out",
    "unreportable",
    "validate_input",
]

_logger = logging.getLogger("async_task_api_worker.engine")

#: The message of every ``INTERNAL_ERROR``: the exception's own text is never published.
INTERNAL_ERROR_MESSAGE: Final = "the task failed with an internal error"

#: The conclusion of a task its client cancelled (docs/protocol.md, "Cancelling a task").
CANCELLED_BY_CLIENT: Final = Failure(ErrorCode.TASK_CANCELLED, TASK_CANCELLED_MESSAGE)


@functools.cache
def _output_adapter(model: type[BaseModel]) -> TypeAdapter[Any]:
    return TypeAdapter(model)


@functools.cache
def _input_names(model: type[BaseModel]) -> frozenset[str]:
    return model_field_names(model)


def invalid_input(model: type[BaseModel], exc: ValidationError) -> Failure:
    """``INVALID_INPUT`` for input that failed ``model``: field names and error types only.

    A name the model does not declare (the client's own key) is masked, as the envelope's rule
    says (docs/protocol.md, "Payloads and secrets").
    """
    why = describe_validation_error(exc, known_names=_input_names(model))
    return Failure(ErrorCode.INVALID_INPUT, f"invalid input: {why}")


def validate_input(task: TaskDefinition, raw_input: Mapping[str, Any]) -> BaseModel | Failure:
    """The task's input model built from ``raw_input``, or its ``INVALID_INPUT`` failure."""
    try:
        return task.input_model.model_validate(raw_input)
    except ValidationError as exc:
        return invalid_input(task.input_model, exc)


def conclude_value(model: type[BaseModel], value: Any) -> Response | Failure:
    """What the handler returned, as the task's output ``model`` dumped to JSON.

    Serialized as the declared model: a subclass's extra fields are not published, and a value
    of the wrong type (``model_construct``, a field mutated after validation) is an
    ``INVALID_RESULT``, not a warning.
    """
    try:
        validated = value if isinstance(value, model) else model.model_validate(value)
        response = _output_adapter(model).dump_python(validated, mode="json", warnings="error")
    except ValidationError as exc:
        why = describe_validation_error(exc)
        return Failure(
            ErrorCode.INVALID_RESULT, f"the handler's result failed its output model: {why}"
        )
    except Exception as exc:  # a serializer of the user's model failed
        return Failure(
            ErrorCode.INVALID_RESULT,
            f"the handler's result could not be serialized ({exception_type_name(exc)})",
        )
    if not isinstance(response, dict):  # a RootModel of a list: not a JSON object
        return Failure(ErrorCode.INVALID_RESULT, "the handler's result is not a JSON object")
    if _free_keys(model):
        # pydantic's JSON dump writes a lone surrogate in a key as U+FFFD: a changed key, not
        # a refusal. The Python dump keeps it, for the one rule (protocol.encoding).
        kept = validated.model_dump(mode="python")
        if lone_surrogate(kept) is not None:
            try:
                refuse_lone_surrogate(kept)
            except ReportEncodeError as exc:
                return unreportable(exc)
    return Response(response)


@functools.cache
def _free_keys(model: type[BaseModel]) -> bool:
    """Whether ``model`` takes object keys of the caller's (a ``dict`` or ``Any`` field)."""
    stack: list[Any] = [model.__pydantic_core_schema__]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") in ("dict", "any"):
                return True
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return False


def task_timeout(timeout_s: float) -> Failure:
    """``TASK_TIMEOUT`` for a task that ran past ``timeout_s`` seconds: its one wording."""
    return Failure(ErrorCode.TASK_TIMEOUT, f"the task did not finish within {timeout_s:g} s")


def timed_out(timeout_s: float) -> Failure:
    """:func:`task_timeout`, logged as a warning (a handler the SDK stopped at its deadline)."""
    _logger.warning("Task handler ran past its timeout of %g s", timeout_s)
    return task_timeout(timeout_s)


def process_killed(signal: str) -> Failure:
    """``WORKER_CRASHED`` for a task's process killed by ``signal`` (a name), not by the SDK."""
    return Failure(ErrorCode.WORKER_CRASHED, f"the task's process was killed by {signal}")


def process_ended(exit_code: int) -> Failure:
    """``INVALID_RESULT`` for a task's process that exited with ``exit_code`` and no answer."""
    return Failure(
        ErrorCode.INVALID_RESULT, f"the task's process exited (code {exit_code}) without a result"
    )


def conclude_error(
    exc: BaseException,
    *,
    timeout_s: float | None = None,
    memory_limit_bytes: int | None = None,
) -> Failure:
    """What a raised exception means for the task; logs what it must.

    A well-formed ``FatalError`` or ``RetryableError`` gives its code and message; a
    ``TaskTimeoutError`` ``TASK_TIMEOUT``; an ``IsolatedTaskError`` its own code; a
    ``MemoryError`` under a memory limit ``WORKER_CRASHED`` (the limit, not the handler);
    anything else, ``SystemExit`` and a stray cancel included, ``INTERNAL_ERROR`` with its type
    and frames in the log only (``observability.redaction``).

    Args:
        exc: what the handler (or its executor) raised.
        timeout_s: the task's timeout, in seconds, for the message of a ``TaskTimeoutError``.
        memory_limit_bytes: the process's memory limit, in bytes, if it has one.
    """
    if isinstance(exc, TaskError) and is_well_formed(exc):
        delay = getattr(exc, "retry_delay_s", None)
        return Failure(exc.task_code, exc.message, retryable=exc.retryable, retry_delay_s=delay)
    if isinstance(exc, TaskTimeoutError):
        return timed_out(timeout_s if timeout_s is not None else float("nan"))
    if isinstance(exc, TaskCancelledError):
        return CANCELLED_BY_CLIENT
    if isinstance(exc, IsolatedTaskError):
        _logger.error("The task's process ended without a result: %s", exc.message)
        return Failure(exc.task_code, exc.message)
    if isinstance(exc, MemoryError) and memory_limit_bytes is not None:
        return Failure(
            ErrorCode.WORKER_CRASHED, f"the task hit its memory limit of {memory_limit_bytes} bytes"
        )
    if isinstance(exc, InvalidErrorCodeError):  # the SDK's words on the handler's own code
        _logger.error(
            "Task handler raised a FatalError or RetryableError with a code the protocol "
            "refuses (%s: codes are upper case, digits and _, and not the SDK's own); "
            "reported as INTERNAL_ERROR\n%s",
            exc,
            safe_traceback(exc),
        )
        return Failure(ErrorCode.INTERNAL_ERROR, INTERNAL_ERROR_MESSAGE)
    _logger.error(
        "Task handler raised %s; reported as INTERNAL_ERROR without its message\n%s",
        exception_type_name(exc),
        safe_traceback(exc),
    )
    return Failure(ErrorCode.INTERNAL_ERROR, INTERNAL_ERROR_MESSAGE)


def unreportable(exc: ReportEncodeError) -> Failure:
    """The failure of a response that cannot go out as a report (too large, not JSON).

    Its one wording, whatever face found it: ``the handler's result cannot be reported:`` and
    what the encoder refused (``value is not valid Unicode: a lone surrogate U+D800 at
    notes.1``, ``value is not canonical JSON: ValueError`` for NaN).
    """
    code = ErrorCode.RESULT_TOO_LARGE if exc.too_large else ErrorCode.INVALID_RESULT
    return Failure(code, f"the handler's result cannot be reported: {exc}")


def sendable(conclusion: Conclusion) -> Conclusion:
    """``conclusion``, or the failure of a response no report could carry (not JSON, say).

    For a child that writes its conclusion out itself (a Step Functions or process-isolated
    child), and for the output a Step Functions subprocess wrote: the same failure the
    worker's report would have met (:func:`unreportable`), from the same checks (NaN, a lone
    surrogate: ``protocol.encoding.check_tree`` with ``valid_unicode``).
    """
    if isinstance(conclusion, Response):
        try:
            check_tree(conclusion.value, valid_unicode=True)
            canonical_dumps(conclusion.value, tree_checked=True)
        except ReportEncodeError as exc:
            return unreportable(exc)
    return conclusion
