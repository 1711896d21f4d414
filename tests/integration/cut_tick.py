"""The ``tick`` command, killed at one step of a task's hand-out (issue 30's partial states).

``python -m tests.integration.cut_tick N TASK_ID tick TARGET --state-dir ...`` runs the command
line, counting each step that changes a state file of ``TASK_ID`` (``TASK_ID.*``, or a
temporary ``.TASK_ID.*``): a file created, written, renamed, linked or removed; and the
worker's launcher, before it starts and once it has returned (the hand-out done, its delivery
not acked yet). Just before step ``N`` (from 0) the process ends with ``os._exit(CUT_EXIT)``:
no clean-up runs, as under ``SIGKILL``. With ``N`` past the last step it is the plain command.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from async_task_api_worker.cli import main

#: The exit code of a cut tick (that of a process killed by SIGKILL, as a shell shows it).
CUT_EXIT: Final = 137


class Cut:
    """Counts the steps on ``task_id``'s files; ends the process at step ``at``."""

    def __init__(self, at: int, task_id: str) -> None:
        self.at = at
        self.task_id = task_id
        self.steps = 0
        self.fds: set[int] = set()

    def step(self) -> None:
        if self.steps == self.at:
            os._exit(CUT_EXIT)
        self.steps += 1

    def names_task(self, path: Any) -> bool:
        name = Path(os.fsdecode(path)).name
        return name.startswith((f"{self.task_id}.", f".{self.task_id}."))

    def install(self) -> None:
        """Wrap the ``os`` calls and ``subprocess.run``."""
        real_open, real_write, real_run = os.open, os.write, subprocess.run

        def opening(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            creates = bool(flags & os.O_CREAT) and self.names_task(path)
            if creates:
                self.step()
            fd = real_open(path, flags, *args, **kwargs)
            if creates:
                self.fds.add(fd)
            return fd

        def writing(fd: int, data: Any) -> int:
            if fd in self.fds:
                self.step()
            return real_write(fd, data)

        def running(argv: Any, *args: Any, **kwargs: Any) -> Any:
            launcher = isinstance(argv, list) and self.task_id in argv
            if launcher:
                self.step()
            done = real_run(argv, *args, **kwargs)
            if launcher:
                self.step()
            return done

        os.open = opening  # type: ignore[assignment]
        os.write = writing
        subprocess.run = running
        for name in ("replace", "rename", "link", "unlink"):
            setattr(os, name, self._on_path(getattr(os, name)))

    def _on_path(self, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def step_then_call(*args: Any, **kwargs: Any) -> Any:
            if any(self.names_task(arg) for arg in args[:2]):
                self.step()
            return call(*args, **kwargs)

        return step_then_call


if __name__ == "__main__":
    Cut(int(sys.argv[1]), sys.argv[2]).install()
    raise SystemExit(main(sys.argv[3:]))
