"""Seed 000's ``exception_levels``: the level each exception is logged at, and the registry.

Seed 000, "Failure taxonomy": a subprocess's error name is looked up among the consumer's
registered exceptions only, never the framework's own (a child printing
``{"error": "AbortedStaleTask"}`` cannot fake the worker's control flow); a class is logged at
the level of the most specific registered class in its MRO, ERROR when none is.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from async_task_api_worker.sfn.errors import FRAMEWORK_EXCEPTIONS

__all__ = ["ExceptionLevels"]

_logger = logging.getLogger("async_task_api_worker.sfn")


class ExceptionLevels:
    """The consumer's ``exception_levels``, read once.

    Args:
        levels: exception class to logging level (the consumer's and, optionally, the
            framework's).
    """

    def __init__(self, levels: Mapping[type[BaseException], int] | None) -> None:
        self._levels: dict[type[BaseException], int] = dict(levels or {})
        # Built once: a subprocess can name a consumer exception, never a framework one.
        self._by_name = {
            kind.__name__: kind
            for kind in self._levels
            if not any(issubclass(kind, own) for own in FRAMEWORK_EXCEPTIONS)
        }

    def registered(self, name: str) -> type[BaseException] | None:
        """The consumer's exception class of that name, or ``None`` (framework ones never)."""
        return self._by_name.get(name)

    def level_of(self, kind: type[BaseException]) -> int:
        """The level of the most specific registered class in ``kind``'s MRO; else ERROR."""
        return next(
            (self._levels[known] for known in kind.__mro__ if known in self._levels),
            logging.ERROR,
        )

    def log(self, kind: type[BaseException], message: str, *args: object) -> None:
        """Log ``message`` at ``kind``'s level, with the field ``error`` naming it."""
        _logger.log(self.level_of(kind), message, *args, extra={"error": kind.__name__})
