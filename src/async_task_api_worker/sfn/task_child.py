"""A Step Functions child that runs an SDK task: ``run_task(worker)``.

The subprocess side for a ``@worker.task`` handler (the one written for RabbitMQ) run by the
Step Functions worker, beside seed 000's :func:`~async_task_api_worker.sfn.run_handler`. The
request (``WORKER_REQUEST`` or ``WORKER_REQUEST_FILE``, as for ``run_handler``) is the SQS body,
a JSON object::

    {"task_token": "...", "input": {...}, "task_id": "optional", "client_id": "optional"}

The handler runs through the task call (:mod:`async_task_api_worker.task_call`), as in every
other face, so the same exception gets the same code and message, and its conclusion is written
on stdout as every child writes it (``conclusion.dump_conclusion``): exit 0 after a response, 1
after a failure. A response that is not JSON concludes as it would in a report
(``task_call.sendable``). Step Functions is the retry source (its ``Retry`` on the code).

Unlike the rest of ``sfn`` (seed 000's extractable framework), this module uses the SDK's task
call and worker definition: it is the bridge between the two.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

from async_task_api_worker.conclusion import Conclusion, Failure
from async_task_api_worker.definition import Worker
from async_task_api_worker.observability import tracing
from async_task_api_worker.protocol.codes import ErrorCode
from async_task_api_worker.sfn.handler import (
    conclude_and_exit,
    read_request,
    result_channel,
    write_and_exit,
)
from async_task_api_worker.task_call import DISCARD_PROGRESS, TaskFields, call_here, sendable

__all__ = ["run_task"]

#: The client id of a task whose request names none.
STEP_FUNCTIONS_CLIENT: str = "step-functions"


def _conclude(worker: Worker, text: str) -> Conclusion:
    try:
        request = json.loads(text)
    except ValueError:
        request = None
    if not isinstance(request, dict) or not isinstance(request.get("input"), dict):
        return Failure(ErrorCode.INVALID_INPUT, "the request has no 'input' object")
    raw_input: dict[str, Any] = request["input"]
    fields = TaskFields(
        task_id=str(request.get("task_id") or "step-functions-task"),
        client_id=str(request.get("client_id") or STEP_FUNCTIONS_CLIENT),
        service=worker.name,
        attempt=1,
        delivery_limit=1,
        trace=tracing.carrier_from_env(),  # the executor's (``sfn.subprocesses``)
    )
    return call_here(worker.task_definition, raw_input, fields, DISCARD_PROGRESS)


def run_task(worker: Worker) -> NoReturn:
    """Run ``worker``'s task on the request, write its conclusion, and exit (see the module)."""
    result_fd = result_channel()
    try:
        conclusion = _conclude(worker, read_request())
    except BaseException:  # no request at all: the parent reports a malformed output
        write_and_exit(result_fd, b"", 2)
    conclude_and_exit(result_fd, sendable(conclusion))
