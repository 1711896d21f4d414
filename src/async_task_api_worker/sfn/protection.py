"""ECS task protection, as seed 000's ``Worker(protection=...)`` takes it.

The client lives with the SQS + Step Functions transport, which holds the protection for the
deliveries in hand (:mod:`async_task_api_worker.transports.sqs_sfn.protection`).
"""

from async_task_api_worker.transports.sqs_sfn.protection import (
    MAX_EXPIRES_IN_MINUTES,
    TaskProtection,
)

__all__ = ["MAX_EXPIRES_IN_MINUTES", "TaskProtection"]
