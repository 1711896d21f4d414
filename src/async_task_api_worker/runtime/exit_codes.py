"""The process exit codes (seed, "Running a worker")."""

from enum import IntEnum

__all__ = ["ExitCode"]


class ExitCode(IntEnum):
    """What the worker process exits with."""

    OK = 0
    """A clean stop (and, in job mode, any task outcome: it was reported to the client)."""
    FAILURE = 1
    """An infrastructure failure: the broker gone for good, a stuck handler after the drain."""
    CONFIG = 2
    """Invalid configuration or usage: a bad setting, the time budget, a definition error,
    refused broker credentials. Retrying will not help."""
