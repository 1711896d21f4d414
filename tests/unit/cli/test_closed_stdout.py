"""Every command stops quietly when its reader goes away (``check ... | head -2``).

The pipe's read end is closed before the command starts, so its first write to stdout fails
every time: no race with a reader that closes "soon". Without ``cli.main``'s recipe Python
prints a ``BrokenPipeError`` (a traceback, or "Exception ignored" at its exit) on stderr.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

TARGET = "examples.count_words:worker"


@pytest.mark.parametrize(
    "command",
    [
        ["check", TARGET],  # a few lines, written at the interpreter's exit without the flush
        ["asyncapi", TARGET],  # a large document: the write itself fails
    ],
)
def test_a_command_whose_stdout_is_closed_stops_quietly(command: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # no reader at all: every write gets EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "async_task_api_worker", *command],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 128 + signal.SIGPIPE
