"""The root of the SDK's exceptions (the tree is drawn in ``errors/__init__.py``)."""

from __future__ import annotations

from typing import ClassVar

__all__ = ["AsyncTaskWorkerError"]


class AsyncTaskWorkerError(Exception):
    """Root of every exception the SDK raises on purpose."""

    code: ClassVar[str] = "INTERNAL_ERROR"
    retryable: ClassVar[bool] = False
