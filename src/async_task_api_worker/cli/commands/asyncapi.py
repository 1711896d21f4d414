"""``asyncapi my_module:worker``: the worker's contract as an AsyncAPI 3.1 document, no broker.

Prints the document (``async_task_api_worker.asyncapi`` has its shape) as JSON, indented by 2,
on stdout. The queue names come from the settings (``IN_QUEUE_NAME``, ``OUT_QUEUE_NAME``, else
the service's defaults), as ``run`` would use them. Exits 0, 2 with one line on stderr for a
bad target or setting, or 1 when stdout is closed before the document is written.
"""

from __future__ import annotations

import json
import sys

from async_task_api_worker.asyncapi import asyncapi_document
from async_task_api_worker.cli.loading import load_target
from async_task_api_worker.runtime.exit_codes import ExitCode
from async_task_api_worker.settings import load_settings

__all__ = ["asyncapi_command"]


def asyncapi_command(target: str) -> int:
    """Print ``target``'s AsyncAPI 3.1 document.

    Args:
        target: ``my_module:worker``.

    Returns:
        The exit code: 0.

    Raises:
        ConfigError: the target, its definition or a setting is wrong, or the task's models
            have no JSON Schema.
    """
    settings = load_settings()
    worker = load_target(target, settings, stream=sys.stderr)  # stdout is the document
    text = json.dumps(asyncapi_document(worker, settings), indent=2, ensure_ascii=False)
    sys.stdout.write(text + "\n")  # a closed stdout: cli.main stops quietly
    return ExitCode.OK
