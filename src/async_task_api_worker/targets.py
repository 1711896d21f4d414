"""Loading ``module:attribute`` into a Worker: for the commands, and the detached worker."""

from __future__ import annotations

import importlib
import os
import sys

from async_task_api_worker.definition import Worker
from async_task_api_worker.errors import DefinitionError, TargetError

__all__ = ["load_worker"]


def load_worker(target: str) -> Worker:
    """Import ``module:attribute`` and return the Worker it names.

    The attribute is a :class:`Worker`, or a function taking no argument that returns one.
    The current directory is importable, as ``python -m`` would make it.

    Raises:
        TargetError: the target is malformed, cannot be imported, or is not a Worker.
        DefinitionError: the module's worker definition is wrong (raised by its decorators).
    """
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise TargetError(f"target {target!r} must look like my_module:worker")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except DefinitionError:
        raise
    except Exception as exc:
        raise TargetError(
            f"cannot import {module_name!r}: {type(exc).__name__}: {_first_line(exc)}"
        ) from exc
    try:
        value = getattr(module, attribute)
    except AttributeError:
        raise TargetError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if isinstance(value, Worker):
        return value
    if callable(value) and not isinstance(value, type):  # a factory, not a class
        try:
            value = value()
        except DefinitionError:
            raise
        except Exception as exc:
            raise TargetError(
                f"factory {target} raised {type(exc).__name__}: {_first_line(exc)}"
            ) from exc
        if isinstance(value, Worker):
            return value
    raise TargetError(f"{target} is not a Worker, nor a function returning one")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"
