"""The process exit codes (seed, "Running a worker")."""

import sys
from enum import IntEnum

from async_task_api_worker.observability.logging import redact_secrets

__all__ = ["ExitCode", "say_error"]


class ExitCode(IntEnum):
    """What the worker process exits with."""

    OK = 0
    """A clean stop (and, in job mode, any task outcome: it was reported to the client)."""
    FAILURE = 1
    """An infrastructure failure: the broker gone for good, a stuck handler after the drain."""
    CONFIG = 2
    """Invalid configuration or usage: a bad setting, the time budget, a definition error,
    refused broker credentials. Retrying will not help."""


def say_error(error: BaseException | str) -> None:
    """Write the one line that goes with an exit code: ``async-task-api-worker: <error>``.

    Its text may quote a library's or the application's exception (an import error, a broker
    refusal), so any ``scheme://user:password@`` in it has its password replaced by ``***``,
    as in every log line (``observability.logging.redact_secrets``).
    """
    print(f"async-task-api-worker: {redact_secrets(str(error))}", file=sys.stderr)
