"""What the reporting says in the log: a refused report, a hold given up, a lost ``started``.

A hold may last until the consumer timeout, so the reporter logs a refusal once at first and
then at most once a minute (``engine.reporting``); each line carries the task's fields.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from async_task_api_worker.errors import PublishError
from async_task_api_worker.observability.redaction import exception_type_name

__all__ = ["gave_up", "refused", "started_lost"]

_logger = logging.getLogger("async_task_api_worker.engine")


def started_lost(extra: Mapping[str, Any]) -> None:
    """``started`` was refused, and the terminal report right behind it was taken."""
    # A full queue freeing one place between the two: the one terminal report stands.
    _logger.warning(
        "The broker refused the started report but took the terminal report sent right "
        "behind it; the consumer gets the terminal report without started",
        extra=dict(extra),
    )


def gave_up(kind: str, why: str, withdrawn: bool, extra: Mapping[str, Any]) -> None:
    """A report other than ``progress`` could not get out, for ``why``."""
    _logger.warning(
        "The %s report could not get out (%s); %s",
        kind,
        why,
        "the delivery was withdrawn: nothing more is sent for it"
        if withdrawn
        else "giving the delivery back",
        extra=dict(extra),
    )


def refused(
    kind: str, exc: PublishError, held_try: int | None, left_s: float, extra: Mapping[str, Any]
) -> None:
    """The broker did not confirm a report; ``held_try`` counts the tries of a held one."""
    _logger.warning(
        "The %s report was not confirmed by the broker (%s)%s",
        kind,
        exception_type_name(exc.__cause__ or exc),
        ""
        if held_try is None
        else f"; holding the delivery and retrying (try {held_try}, up to "
        f"{max(0.0, left_s):.0f} s more)",
        extra=dict(extra),
    )
