"""``run my_module:worker``: the worker on RabbitMQ, until SIGTERM or SIGINT.

``--processes N`` (or ``WORKER_PROCESSES``) above 1 makes it the supervisor of N worker
processes (``runtime.processes``); each of them is this command again, with the same setting
flags, ``--processes 1`` and the link that ``runtime.supervised`` sets.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from async_task_api_worker.cli.inputs import readable
from async_task_api_worker.cli.loading import load_target
from async_task_api_worker.runtime.entry import run_worker, runner_for, shutdown_bounds
from async_task_api_worker.runtime.exit_codes import ExitCode
from async_task_api_worker.runtime.supervised import become_child, child_link
from async_task_api_worker.settings import flag_arguments, load_settings

__all__ = ["run_command"]


def run_command(target: str, *, flags: Mapping[str, str] | None = None) -> int:
    """Load the settings and the worker (exit 2 on an error in either), then run it.

    Args:
        target: ``my_module:worker``.
        flags: the setting flags' values by field name (``{"worker_processes": "2"}``); they
            win over the environment.

    Raises:
        ConfigError: the target, its definition or a setting is wrong (the caller exits 2).
    """
    flags = dict(flags or {})
    settings = readable(load_settings(flags), sys.stdout)  # it logs to stdout; text on a tty
    worker = load_target(target, settings)
    if settings.worker_processes > 1:
        from async_task_api_worker.runtime.processes import supervise

        _, process_bound_s = shutdown_bounds(worker, settings)
        flags.pop("worker_processes", None)  # each worker process is one
        if "broker_url" in flags:
            # To the worker processes in their environment, not on their command lines, which
            # anyone on the host may list (``ps``), password and all.
            os.environ["BROKER_URL"] = flags.pop("broker_url")
        return int(
            supervise(
                target, settings, process_bound_s=process_bound_s, flags=flag_arguments(flags)
            )
        )
    link = child_link()
    probes_socket = None if link is None else become_child(link)
    if link is not None and probes_socket is None:
        print("async-task-api-worker: the supervisor is gone; not starting", file=sys.stderr)
        return ExitCode.OK
    return int(
        run_worker(worker, build=lambda: runner_for(worker, settings), probes_socket=probes_socket)
    )
