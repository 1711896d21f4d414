"""Loading what a reference names, for every face: one loader.

A reference is ``module:qualified.name``, or ``path/to/file.py:qualified.name`` (the file is
loaded by its path, its directory made importable first: a cron's child does not inherit
``PYTHONPATH``). ``__main__:name`` names the worker's own script, loaded from its path under
the name ``__mp_main__`` (as multiprocessing does), so that its ``if __name__ == "__main__":``
block does not run again. The current directory is importable, as ``python -m`` makes it.

Used by the commands (``run``, ``dev``, ``check``, ``tick``), the process executor's fork server
and child, and the detached worker.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from async_task_api_worker.definition import Worker
from async_task_api_worker.errors import DefinitionError, TargetError

__all__ = ["load_module", "load_reference", "load_worker"]


def _module_from_file(path: Path, name: str) -> ModuleType:
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None) == str(path):
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_reference(reference: str, *, main_path: str | None = None) -> Any:
    """The object ``reference`` names (see the module).

    Args:
        reference: ``module:qualified.name`` or ``path/to/file.py:qualified.name``.
        main_path: the path of the worker's script, for a ``__main__:`` reference.

    Raises:
        ImportError: the module or file cannot be loaded (or a ``__main__`` reference without
            ``main_path``); whatever the module raises while it is imported propagates.
        AttributeError: it has no such name.
    """
    location, _, qualname = reference.rpartition(":")
    if not location or not qualname:
        raise ImportError(f"reference {reference!r} must look like module:name")
    target: Any = load_module(location, main_path=main_path)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def load_module(location: str, *, main_path: str | None = None) -> ModuleType:
    """The module of a reference's ``location``: a module name, a ``.py`` path or ``__main__``.

    Raises:
        ImportError: it cannot be loaded; whatever the module raises on import propagates.
    """
    if location == "__main__":
        if main_path is None:
            raise ImportError("the reference is in __main__, and the script's path is unknown")
        module = sys.modules.get("__mp_main__") or _module_from_file(Path(main_path), "__mp_main__")
    elif location.endswith(".py"):
        path = Path(location).resolve()
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        module = _module_from_file(path, path.stem)
    else:
        cwd = os.getcwd()
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        module = importlib.import_module(location)
    return module


def load_worker(target: str) -> Worker:
    """Import ``module:attribute`` and return the Worker it names.

    The attribute is a :class:`Worker`, or a function taking no argument that returns one.
    The current directory is importable, as ``python -m`` would make it.

    Raises:
        TargetError: the target is malformed, cannot be imported, or is not a Worker.
        DefinitionError: the module's worker definition is wrong (raised by its decorators).
    """
    module_name, _, attribute = target.rpartition(":")
    if not module_name or not attribute:
        raise TargetError(f"target {target!r} must look like my_module:worker")
    try:
        module = load_module(module_name)
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
