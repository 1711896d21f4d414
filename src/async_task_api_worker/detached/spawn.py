"""Handing work to a detached worker (seed 002, "Detached worker").

:func:`spawn_detached` hands the work out with one atomic write, then starts
``python -m async_task_api_worker.detached`` in a new session, with no inherited pipe: a kill of
the caller's process group (a cron's budget kill) cannot take it down. The message is staged
under a temporary name first; the in-flight marker's write is the commit (the durable receipt:
after it, the caller may ack its input, ``state.handed_out``); the message is put in place
right after it. Killed before the commit, the caller leaves the work not handed out (a temporary
file at most, which a sweep removes): its input comes back and runs again. Killed after it, the
caller leaves a marker a sweep concludes: the worker's result, or ``WORKER_DIED`` at the
deadline. The worker records its own pid, start time and boot id in the marker, runs the
handler, writes the result file, then removes the marker. If the worker cannot be started, the
work runs here, synchronously, as the seed's fallback says: late, but never dropped.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

from async_task_api_worker.detached.marker import Marker
from async_task_api_worker.detached.run import run_work
from async_task_api_worker.detached.state import (
    DONE_SUFFIX,
    INPUT_SUFFIX,
    MARKER_SUFFIX,
    out_beside,
    place,
    stage,
)
from async_task_api_worker.protocol.envelope import ID_PATTERN

__all__ = ["SPAWN_TIMEOUT_S", "spawn_detached"]

# Forks before it imports anything heavy: the caller waits milliseconds, not an import, and a
# kill of the caller in that window can no longer catch the worker half started.
_LAUNCHER: Final = (
    "import os, sys\n"
    "if os.fork():\n"
    "    os._exit(0)\n"
    "os.setsid()\n"
    "from async_task_api_worker.detached.run import main\n"
    "main(sys.argv[1:])\n"
)
#: Seconds the launcher may take to fork the worker and exit.
SPAWN_TIMEOUT_S = 30.0
# The protocol's id rule: a file name with no path in it, and no leading dot.
_SAFE_ID: Final = re.compile(ID_PATTERN)

_logger = logging.getLogger("async_task_api_worker.detached")


def spawn_detached(
    state_dir: Path,
    correlation_id: str,
    message: dict[str, Any],
    *,
    handler: str,
    deadline_s: float,
    meta: dict[str, Any] | None = None,
    sdk_worker: bool = False,
    forget_reported: bool = True,
) -> Marker:
    """Start a detached worker for ``message``.

    Args:
        state_dir: the state directory (created if missing).
        correlation_id: the work's id: names its files, and comes back with its result.
        message: the work's input (a JSON object).
        handler: ``module:function``, or ``path/to/file.py:function`` (its directory is made
            importable), of a function taking the message and returning a JSON object; with
            ``sdk_worker``, the ``module:worker`` whose task runs (the ``tick`` command).
        deadline_s: seconds the work may take; past them, the worker stops itself and a sweep
            reports ``TASK_TIMEOUT``, or ``WORKER_DIED`` if it died.
        meta: kept in the marker and returned with the result (what the caller needs to report).
        sdk_worker: ``handler`` names an SDK ``Worker``.
        forget_reported: new work under an id whose outcome was reported (its ``.done``)
            starts afresh; ``False`` (the ``tick``: a task id is one task) refuses it.

    Returns:
        The marker written (its ``pid`` is set by the worker itself).

    Raises:
        ValueError: ``correlation_id`` is not a safe file name (``^[A-Za-z0-9][A-Za-z0-9._:@-]
            {0,127}$``, the protocol's task id rule).
        FileExistsError: the work of ``correlation_id`` is out already (its marker, its
            result, or without ``forget_reported`` its ``.done``): nothing was started.
        OSError: the state files could not be written (nothing was started).
    """
    if not _SAFE_ID.fullmatch(correlation_id):
        raise ValueError(f"correlation id {correlation_id!r} is not a safe file name")
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    marker = Marker.new(correlation_id, deadline_s, meta or {})
    if forget_reported:
        # New work under an id reported before: its one-outcome record is the old work's. Removed
        # before the commit, so that no sweep takes the new marker for a reported task's.
        (state_dir / f"{correlation_id}{DONE_SUFFIX}").unlink(missing_ok=True)
    input_path = state_dir / f"{correlation_id}{INPUT_SUFFIX}"
    staged = stage(input_path, json.dumps(message).encode())
    marker_path = state_dir / f"{correlation_id}{MARKER_SUFFIX}"
    try:
        # The commit: from here on the work is handed out, and a sweep concludes it. Exclusive:
        # of two hand-outs of one work at once (a tick that lost its link, and the one that got
        # the redelivery), one commits and the other stops here; so does one that commits while
        # an earlier hand-out's worker finishes or its result is being reported.
        place(stage(marker_path, marker.to_json()), marker_path, exclusive=True)
        if out_beside(state_dir, correlation_id, reported=not forget_reported):
            marker_path.unlink()
            raise FileExistsError(f"the work of {correlation_id} is out already")
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    place(staged, input_path)
    argv = [
        sys.executable,
        "-c",
        _LAUNCHER,
        "--state-dir",
        str(state_dir.resolve()),
        "--correlation-id",
        correlation_id,
        "--handler",
        handler,
        *(["--sdk-worker"] if sdk_worker else []),
    ]
    log_path = state_dir / f"{correlation_id}.log"
    try:
        with open(log_path, "ab") as log:
            # The started process forks the worker and exits at once (a double fork): the
            # worker is nobody's child here, so it never lingers as this process's zombie.
            started = subprocess.run(  # noqa: S603 - our own interpreter and module
                argv,
                start_new_session=True,  # a kill of the caller's group leaves it alone
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                close_fds=True,
                cwd=os.getcwd(),
                timeout=SPAWN_TIMEOUT_S,
                check=False,
            )
        if started.returncode != 0:
            raise OSError(f"the detached worker's launcher exited with {started.returncode}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        _logger.warning(
            "Could not start a detached worker (%s): running %s here, synchronously",
            type(exc).__name__,
            correlation_id,
        )
        run_work(state_dir, correlation_id, handler, sdk_worker=sdk_worker)
    return marker
