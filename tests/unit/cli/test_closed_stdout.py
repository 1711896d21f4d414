"""Every command stops quietly when its reader goes away (``check ... | head -2``).

The pipe's read end is closed before the command starts, so its first write to stdout fails
every time: no race with a reader that closes "soon". Without ``cli.main``'s recipe Python
prints a ``BrokenPipeError`` (a traceback, or "Exception ignored" at its exit) on stderr.
"""

from __future__ import annotations

import pytest

from tests.closed_pipes import CLOSED_STDOUT, with_closed_stdout

TARGET = "examples.count_words:worker"


@pytest.mark.parametrize(
    "command",
    [
        ["check", TARGET],  # a few lines, written at the interpreter's exit without the flush
        ["asyncapi", TARGET],  # a large document: the write itself fails
    ],
)
def test_a_command_whose_stdout_is_closed_stops_quietly(command: list[str]) -> None:
    done = with_closed_stdout(*command)
    assert done.stderr == ""
    assert done.returncode == CLOSED_STDOUT
