"""The only module of the package that imports boto3 and botocore.

AWS's answers become the SDK's exceptions here (``raise OurError(...) from exc``), so the
transport above never sees a botocore type:

- a task token Step Functions no longer waits on (``TaskTimedOut``, ``InvalidToken``,
  ``TaskDoesNotExist``) is :class:`StaleTokenError`;
- an output Step Functions refuses (``InvalidOutput``) is ``ReportRefusedError``;
- throttling, 5xx answers and network errors left after botocore's own retries are
  ``PublishError`` / ``SettleError`` / ``TransportError``: passing conditions, tried again;
- any other refusal of a report (a 4xx: ``ValidationException``, ``AccessDeniedException``) is
  ``ReportRefusedError`` too: trying it again for half an hour cannot help;
- an SQS queue that does not exist, or credentials AWS refuses, is ``BrokerRefusedError`` at
  start and :class:`QueueRefusedError` later (the worker stops: every message would run again);
- a missing region or a malformed ``AWS_ENDPOINT_URL`` is ``BrokerRefusedError``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

try:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError
except ImportError as exc:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        "the SQS + Step Functions transport needs boto3 (the SDK's `aws` extra)"
    ) from exc

from async_task_api_worker.errors import (
    BrokerRefusedError,
    PublishError,
    ReportRefusedError,
    SettleError,
    TransportError,
)

__all__ = [
    "STALE_TOKEN_CODES",
    "QueueRefusedError",
    "SqsApi",
    "StaleTokenError",
    "StepFunctionsApi",
    "make_clients",
    "region_of",
]

#: botocore's standard retry mode: throttling and 5xx answers are retried with a jittered
#: exponential backoff, up to this many attempts in all; and no call waits on a stuck endpoint
#: for long: 5 s to connect, 10 s to read (a long poll adds its own wait to the read).
_CONFIG: Final = Config(
    retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5, read_timeout=10
)

_REGION_IN_HOST: Final = re.compile(r"sqs[.-]([a-z]{2}(?:-[a-z]+)+-[0-9])\.amazonaws\.com(?:\.cn)?")

#: The errors Step Functions answers for a task token it no longer waits on (AWS API
#: reference, ``SendTaskHeartbeat`` / ``SendTaskSuccess`` / ``SendTaskFailure``).
STALE_TOKEN_CODES: Final = frozenset({"TaskTimedOut", "InvalidToken", "TaskDoesNotExist"})

#: SQS errors that retrying cannot fix: the queue is not there, or AWS refuses who we are.
_REFUSED_CODES: Final = frozenset(
    {
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "InvalidAddress",
    }
)


#: Answers that a later try may get past: AWS's throttling codes (and any 5xx).
_PASSING_CODES: Final = frozenset(
    {
        "ThrottlingException",
        "Throttling",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "ProvisionedThroughputExceededException",
        "RequestTimeout",
        "RequestTimeoutException",
        "ServiceUnavailable",
        "InternalFailure",
        "InternalServerError",
    }
)


class QueueRefusedError(TransportError):
    """SQS refuses the queue for good (it was deleted, or the role lost its rights)."""


class StaleTokenError(PublishError):
    """Step Functions no longer waits on the task token: nothing more can be sent for it.

    Attributes:
        aws_code: AWS's error code (``TaskTimedOut``, ``InvalidToken``, ``TaskDoesNotExist``).
    """

    def __init__(self, aws_code: str) -> None:
        self.aws_code = aws_code
        super().__init__(f"the task token is stale ({aws_code})")


def region_of(queue_url: str) -> str | None:
    """The region an AWS queue URL names (``https://sqs.eu-west-1.amazonaws.com/...``)."""
    found = _REGION_IN_HOST.fullmatch(urlsplit(queue_url).hostname or "")
    return found.group(1) if found else None


def make_clients(
    sqs: Any = None, stepfunctions: Any = None, *, queue_url: str | None = None
) -> tuple[Any, Any]:
    """The SQS and Step Functions clients: the given ones, or new ones.

    New ones read the region, the credentials and ``AWS_ENDPOINT_URL`` from the environment,
    as boto3 does, with the retries and timeouts above; without a region there, the one the
    queue's URL names.

    Raises:
        BrokerRefusedError: no region anywhere, or ``AWS_ENDPOINT_URL`` is not an endpoint.
    """
    options: dict[str, Any] = {"config": _CONFIG}
    if boto3.session.Session().region_name is None and queue_url is not None:
        region = region_of(queue_url)
        if region is not None:
            options["region_name"] = region
    try:
        if sqs is None:
            sqs = boto3.client("sqs", **options)
        if stepfunctions is None:
            stepfunctions = boto3.client("stepfunctions", **options)
    except NoRegionError as exc:
        raise BrokerRefusedError(
            "no AWS region (AWS_DEFAULT_REGION, a profile, or a queue URL that names one)"
        ) from exc
    except ValueError as exc:  # botocore: "Invalid endpoint: ..."
        raise BrokerRefusedError("AWS_ENDPOINT_URL is not a valid endpoint URL") from exc
    return sqs, stepfunctions


def _code(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", "Unknown"))
    return type(exc).__name__


def _passing(exc: ClientError) -> bool:
    """Whether a later try may get past this answer (throttling, a 5xx)."""
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return _code(exc) in _PASSING_CODES or (status is not None and int(status) >= 500)


class StepFunctionsApi:
    """``SendTaskHeartbeat``, ``SendTaskSuccess`` and ``SendTaskFailure`` on one client."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def _send(self, operation: str, **arguments: str) -> None:
        try:
            getattr(self._client, operation)(**arguments)
        except ClientError as exc:
            code = _code(exc)
            if code in STALE_TOKEN_CODES:
                raise StaleTokenError(code) from exc
            if code == "InvalidOutput":
                raise ReportRefusedError(
                    "Step Functions refused the output (InvalidOutput)"
                ) from exc
            if not _passing(exc) and operation != "send_task_heartbeat":
                # A 4xx other than throttling: holding the report for half an hour cannot
                # help (a ValidationException, a role without states:SendTaskSuccess).
                raise ReportRefusedError(f"Step Functions refused the call ({code})") from exc
            raise PublishError(f"Step Functions answered {code}") from exc
        except BotoCoreError as exc:
            raise PublishError(f"Step Functions could not be reached ({_code(exc)})") from exc

    def heartbeat(self, token: str) -> None:
        """Send a heartbeat for ``token``.

        Raises:
            StaleTokenError: the token is stale.
            PublishError: it could not be sent (after botocore's retries).
        """
        self._send("send_task_heartbeat", taskToken=token)

    def succeed(self, token: str, output: str) -> None:
        """End ``token`` with ``output`` (a JSON text).

        Raises:
            StaleTokenError: the token is stale.
            ReportRefusedError: Step Functions refused the output (``InvalidOutput``), or the
                call for good (another 4xx).
            PublishError: it could not be sent (throttling, a 5xx, the network).
        """
        self._send("send_task_success", taskToken=token, output=output)

    def fail(self, token: str, error: str, cause: str) -> None:
        """End ``token`` with ``error`` (at most 256 characters) and ``cause`` (32,768).

        Raises:
            StaleTokenError: the token is stale.
            ReportRefusedError: Step Functions refused the call for good (a 4xx).
            PublishError: it could not be sent (throttling, a 5xx, the network).
        """
        self._send("send_task_failure", taskToken=token, error=error, cause=cause)


class SqsApi:
    """The few SQS calls of the transport, on one client and one queue."""

    def __init__(self, client: Any, queue_url: str) -> None:
        self._client = client
        self._queue_url = queue_url

    def check(self) -> None:
        """Make sure the queue exists and is ours to read.

        Raises:
            BrokerRefusedError: the queue does not exist, or AWS refuses the credentials.
            TransportError: AWS could not be reached (tried again later).
        """
        try:
            self._client.get_queue_attributes(
                QueueUrl=self._queue_url, AttributeNames=["VisibilityTimeout"]
            )
        except NoCredentialsError as exc:
            raise BrokerRefusedError(
                "no AWS credentials (AWS_ACCESS_KEY_ID, a profile or a task role)"
            ) from exc
        except ClientError as exc:
            code = _code(exc)
            if code in _REFUSED_CODES:
                raise BrokerRefusedError(f"SQS refused the queue SQS_QUEUE_URL ({code})") from exc
            raise TransportError(f"SQS answered {code}") from exc
        except BotoCoreError as exc:
            raise TransportError(f"SQS could not be reached ({_code(exc)})") from exc

    def receive(self, max_messages: int, wait_s: int) -> list[Mapping[str, Any]]:
        """Long-poll for at most ``max_messages`` (1..10) messages, ``wait_s`` seconds.

        Raises:
            QueueRefusedError: SQS refuses the queue for good.
            TransportError: the call failed.
        """
        try:
            answer = self._client.receive_message(
                QueueUrl=self._queue_url,
                MaxNumberOfMessages=max(1, min(10, max_messages)),
                WaitTimeSeconds=wait_s,
                # A producer's trace context, if the state sends one (docs/observability.md).
                MessageAttributeNames=["traceparent", "tracestate"],
            )
        except ClientError as exc:
            self._refused(exc, "receive from")
            raise TransportError(f"receiving from SQS failed ({_code(exc)})") from exc
        except BotoCoreError as exc:
            raise TransportError(f"receiving from SQS failed ({_code(exc)})") from exc
        return list(answer.get("Messages", []))

    def delete(self, receipt_handle: str) -> None:
        """Delete a received message.

        Raises:
            QueueRefusedError: SQS refuses deletes for good (the role lacks
                ``sqs:DeleteMessage``, the queue is gone).
            SettleError: the delete did not go through.
        """
        try:
            self._client.delete_message(QueueUrl=self._queue_url, ReceiptHandle=receipt_handle)
        except ClientError as exc:
            self._refused(exc, "delete from")
            raise SettleError(f"deleting the SQS message failed ({_code(exc)})") from exc
        except BotoCoreError as exc:
            raise SettleError(f"deleting the SQS message failed ({_code(exc)})") from exc

    @staticmethod
    def _refused(exc: ClientError, what: str) -> None:
        code = _code(exc)
        if code in _REFUSED_CODES:
            raise QueueRefusedError(
                f"SQS refuses to let the worker {what} SQS_QUEUE_URL ({code})"
            ) from exc

    def make_visible(self, receipt_handle: str) -> None:
        """Hand a received message back to the queue at once (its visibility timeout to 0).

        Raises:
            SettleError: the call did not go through (the message comes back anyway, once its
                visibility timeout runs out).
        """
        try:
            self._client.change_message_visibility(
                QueueUrl=self._queue_url, ReceiptHandle=receipt_handle, VisibilityTimeout=0
            )
        except (ClientError, BotoCoreError) as exc:
            raise SettleError(f"handing the SQS message back failed ({_code(exc)})") from exc
