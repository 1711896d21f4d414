"""``vectors DIR``: copy the golden vectors, their manifest and the JSON Schemas out of the package.

For another language's test suite (docs/conformance.md, "The golden vectors"). Prints one line,
how many vectors and where (the schemas in ``DIR/schemas/``); exits 0, 2 with one line when
``DIR`` is not an empty or missing folder (``--force`` writes into a non-empty one, deleting
nothing), 1 when a file cannot be written.
"""

from __future__ import annotations

from pathlib import Path

from async_task_api_worker.conformance.golden import MANIFEST_NAME, SCHEMAS_FOLDER, export_vectors
from async_task_api_worker.runtime.exit_codes import ExitCode, say_error

__all__ = ["vectors_command"]


def vectors_command(dest: str, *, force: bool = False) -> int:
    """Export the golden vectors and the JSON Schemas into ``dest``; return the exit code.

    Args:
        dest: the folder to write, created if missing.
        force: write into a non-empty ``dest``, overwriting files of the same names.
    """
    path = Path(dest)
    try:
        count = export_vectors(path, force=force)
    except FileExistsError as exc:
        say_error(f"{exc}: --force writes into it, overwriting files of the same names")
        return ExitCode.CONFIG
    except NotADirectoryError as exc:
        say_error(exc)
        return ExitCode.CONFIG
    except OSError as exc:  # a read-only or full disk, a permission: not the caller's usage
        say_error(f"cannot write the vectors to {path}: {exc}")
        return ExitCode.FAILURE
    print(
        f"{count} golden vectors and the JSON Schemas written to {path.resolve()} "
        f"(index: {MANIFEST_NAME}; schemas: {SCHEMAS_FOLDER}/)"
    )
    return ExitCode.OK
