"""What the commands read from people: JSON objects (task inputs, input references)."""

from __future__ import annotations

import json

from async_task_api_worker.errors import TargetError

__all__ = ["json_object"]


def json_object(text: str, what: str) -> dict[str, object]:
    """``text`` read as a JSON object (a task input of ``dev`` and ``submit``, an input ref).

    Raises:
        TargetError: ``text`` is not JSON, or not an object; the message names ``what``.
    """
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise TargetError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise TargetError(f"{what} must be a JSON object")
    return value
