"""The request and error models shared by the parent and the subprocess (seed 000, "Protocol")."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints

__all__ = ["ErrorOutput", "NonEmptyStr", "WorkerRequest"]

NonEmptyStr = Annotated[str, StringConstraints(min_length=1, strip_whitespace=True)]
"""A string with at least one character once surrounding whitespace is stripped."""


class WorkerRequest(BaseModel):
    """Base of request schemas: the SQS body, which carries the Step Functions task token.

    The state machine's ``sqs:sendMessage.waitForTaskToken`` state puts the token in the body
    as ``task_token`` (``"task_token.$": "$$.Task.Token"``). Subclass it with your fields; the
    parent's schema needs only the routing fields (use ``extra="ignore"``), the subprocess's
    validates the whole request.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    task_token: NonEmptyStr


class ErrorOutput(BaseModel):
    """Seed 000's name for what a failing subprocess reports: the failure's code and message.

    ``error`` is the exception's class name, ``message`` its text. On stdout they travel as
    the failure of the one conclusion JSON (``conclusion.dump_conclusion``), then exit 1.
    """

    error: str
    message: str
