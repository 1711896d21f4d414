"""The command line run with a stdout whose reader is already gone (``... | head``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

#: The exit of a command stopped by a closed stdout: 128 + SIGPIPE, as the shell has it.
CLOSED_STDOUT = 128 + signal.SIGPIPE

REPO = Path(__file__).resolve().parents[1]


def with_closed_stdout(
    *arguments: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``async-task-api-worker ARGUMENTS``; its every write to stdout gets EPIPE.

    The pipe's read end is closed before the command starts: no race with a reader that
    closes "soon".
    """
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "async_task_api_worker", *arguments],
            cwd=REPO,
            env=env,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
