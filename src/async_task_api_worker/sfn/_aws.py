"""The only module of ``async_task_api_worker.sfn`` that imports boto3.

Step Functions' answers are mapped here: a heartbeat returns the error code instead of raising
(the worker decides what a stale token means), and a success or failure that cannot be sent is
logged, never raised (the message is already deleted; Step Functions will time the task out).
"""

from __future__ import annotations

import logging
from typing import Any, Final

try:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError
except ImportError as exc:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        "async_task_api_worker.sfn needs boto3: pip install 'async-task-api-worker[aws]'"
    ) from exc

__all__ = ["StepFunctionsClient", "make_clients"]

_logger = logging.getLogger("async_task_api_worker.sfn")

#: botocore's standard retry mode: throttling and 5xx answers are retried with a jittered
#: exponential backoff, up to this many attempts in all.
#: And no call waits on a stuck endpoint for long: 5 s to connect, 10 s to read.
_RETRIES: Final = Config(
    retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5, read_timeout=10
)


def make_clients(sqs: Any = None, stepfunctions: Any = None) -> tuple[Any, Any]:
    """The SQS and Step Functions clients: the given ones, or new ones.

    New ones read the region, the credentials and ``AWS_ENDPOINT_URL`` from the environment,
    as boto3 does.
    """
    if sqs is None:
        sqs = boto3.client("sqs", config=_RETRIES)
    if stepfunctions is None:
        stepfunctions = boto3.client("stepfunctions", config=_RETRIES)
    return sqs, stepfunctions


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "Unknown"))


class StepFunctionsClient:
    """``SendTaskHeartbeat``, ``SendTaskSuccess`` and ``SendTaskFailure``, never raising."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def heartbeat(self, token: str) -> str | None:
        """Send a heartbeat; ``None`` if accepted, else the error code.

        The code is ``TaskTimedOut``, ``InvalidToken`` or ``TaskDoesNotExist`` for a stale
        token, or a transient one left after botocore's retries.
        """
        try:
            self._client.send_task_heartbeat(taskToken=token)
        except ClientError as exc:
            code = _code(exc)
            _logger.info("The heartbeat was refused (%s)", code)
            return code
        except BotoCoreError as exc:
            _logger.warning("The heartbeat could not be sent (%s)", type(exc).__name__)
            return type(exc).__name__
        return None

    def succeed(self, token: str, output: str) -> bool:
        """Send the task's output; ``False`` (logged) if Step Functions refused it."""
        try:
            self._client.send_task_success(taskToken=token, output=output)
        except (ClientError, BotoCoreError) as exc:
            self._refused("success", exc)
            return False
        return True

    def fail(self, token: str, error: str, cause: str) -> bool:
        """Send the task's failure; ``False`` (logged) if Step Functions refused it."""
        try:
            self._client.send_task_failure(taskToken=token, error=error, cause=cause)
        except (ClientError, BotoCoreError) as exc:
            self._refused("failure", exc)
            return False
        return True

    @staticmethod
    def _refused(what: str, exc: Exception) -> None:
        code = _code(exc) if isinstance(exc, ClientError) else type(exc).__name__
        _logger.warning("Step Functions did not take the task's %s (%s)", what, code)
