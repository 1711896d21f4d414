"""The subprocess's side: ``run_handler(request_schema, handler)`` (seed 000, "Protocol").

The request arrives in ``WORKER_REQUEST`` (the raw SQS body) or, when it is too large or not
fit for an environment variable, in a private file named by ``WORKER_REQUEST_FILE``: read
either way, transparently. The conclusion is written on stdout as every child writes it
(``conclusion.dump_conclusion``): the response and exit 0, or a failure whose code is the
exception's class name (seed 000's name, which the parent looks up) and exit 1 (the traceback
goes to stderr). While the handler runs, file
descriptor 1 points at stderr, so its ``print()`` calls, a library's banner or a C extension's
writes cannot corrupt the result: only ``run_handler`` writes to the real stdout.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, Final, NoReturn, TypeVar

from pydantic import BaseModel, ValidationError

from async_task_api_worker.conclusion import Conclusion, Failure, Response, dump_conclusion
from async_task_api_worker.observability import tracing
from async_task_api_worker.protocol.envelope import describe_validation_error, model_field_names
from async_task_api_worker.sfn.errors import named_failure
from async_task_api_worker.sfn.request import WorkerRequest
from async_task_api_worker.task_call import conclude_value

__all__ = [
    "REQUEST_ENV",
    "REQUEST_FILE_ENV",
    "read_request",
    "conclude_and_exit",
    "result_channel",
    "run_handler",
    "write_and_exit",
]

#: The environment variable that holds the raw request.
REQUEST_ENV: Final = "WORKER_REQUEST"
#: The environment variable that names the private file holding it instead.
REQUEST_FILE_ENV: Final = "WORKER_REQUEST_FILE"

RequestT = TypeVar("RequestT", bound=WorkerRequest)


def read_request() -> str:
    """The raw request: the private file ``WORKER_REQUEST_FILE`` names, else ``WORKER_REQUEST``.

    Raises:
        KeyError: neither is set.
        OSError: the file cannot be read.
    """
    return _read_request()


def _read_request() -> str:
    path = os.environ.get(REQUEST_FILE_ENV)
    if path:
        with open(path, encoding="utf-8") as request_file:
            return request_file.read()
    return os.environ[REQUEST_ENV]


def _response(result: Any) -> Conclusion:
    if isinstance(result, BaseModel):  # dumped as the task call dumps an output model
        return conclude_value(type(result), result)
    if not isinstance(result, dict):
        raise TypeError(f"the handler returned {type(result).__name__}, not a JSON object")
    return Response(result)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def result_channel() -> int:
    """Keep the real stdout for the result and point file descriptor 1 at stderr.

    Returns:
        A duplicate of the real stdout: only :func:`write_and_exit` writes there.
    """
    sys.stdout.flush()
    result_fd = os.dup(1)
    os.dup2(2, 1)  # the handler's own output goes to stderr from here on
    return result_fd


def write_and_exit(result_fd: int, data: bytes, code: int) -> NoReturn:
    """Flush the handler's output, write ``data`` as the result and exit with ``code``."""
    sys.stdout.flush()
    sys.stderr.flush()
    _write_all(result_fd, data)
    os._exit(code)


def conclude_and_exit(result_fd: int, conclusion: Conclusion) -> NoReturn:
    """Write ``conclusion`` as the result and exit: 0 after a response, 1 after a failure.

    Raises:
        ValueError, TypeError: a response that is not JSON (nothing is written then).
    """
    data = dump_conclusion(conclusion)
    write_and_exit(result_fd, data, 1 if isinstance(conclusion, Failure) else 0)


def run_handler(request_schema: type[RequestT], handler: Callable[[RequestT], Any]) -> NoReturn:
    """Parse the request, run ``handler`` on it, write the result, and exit.

    Args:
        request_schema: the subprocess's full request model (a ``WorkerRequest`` subclass).
        handler: takes the validated request and returns a pydantic model or a dict (a JSON
            object); may be ``async def``. Anything it raises becomes a failure with the
            exception's class name and message (a validation error of the request is
            described by field names and error types, never values).

    Exits with 0 after a response, 1 after a failure.
    """
    result_fd = result_channel()
    try:
        request = request_schema.model_validate_json(_read_request())
        with tracing.continued(tracing.carrier_from_env()):  # the delivery's trace, if any
            result = handler(request)
            if inspect.isawaitable(result):
                result = asyncio.run(_awaited(result))
        conclude_and_exit(result_fd, _response(result))
    except BaseException as exc:
        if isinstance(exc, ValidationError):
            # Pydantic's own text and traceback quote the values: only names and types here,
            # and a key the schema does not declare (the client's own) masked as <key>.
            known = model_field_names(request_schema)
            message = f"invalid request: {describe_validation_error(exc, known_names=known)}"
            print(f"ValidationError: {message}", file=sys.stderr)
        else:
            traceback.print_exc()
            message = str(exc)
        conclude_and_exit(result_fd, named_failure(exc, message))


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
