"""The SQS + Step Functions transport (``WORKER_TRANSPORT=sqs-sfn``; needs the ``aws`` extra).

Importing it without boto3 raises ``ImportError`` saying what to install. docs/sfn.md has how
each report maps to the Step Functions API and how a task token is ended on every path.
"""

from async_task_api_worker.transports.sqs_sfn.protection import (
    ProtectionLease,
    TaskProtection,
    protection_minutes,
)
from async_task_api_worker.transports.sqs_sfn.tokens import GIVEN_BACK_ERROR
from async_task_api_worker.transports.sqs_sfn.transport import SqsSfnTransport

__all__ = [
    "GIVEN_BACK_ERROR",
    "ProtectionLease",
    "SqsSfnTransport",
    "TaskProtection",
    "protection_minutes",
]
