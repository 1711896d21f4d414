"""``dev --reload``: a change to the worker's module restarts the dev worker on the new code."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from async_task_api_worker.cli.commands.reload import watched_roots

MODULE = """
from pydantic import BaseModel

from async_task_api_worker import TaskContext, Worker


class Input(BaseModel):
    n: int


class Output(BaseModel):
    said: str


worker = Worker("reloaded")


@worker.task(timeout=5)
async def handle(task_input: Input, ctx: TaskContext) -> Output:
    return Output(said="{word}-" + str(task_input.n))
"""

WAIT_S = 60
#: The longest a dev worker with a 1 s grace takes to drain and exit, in seconds.
DRAIN_S = 30


class _Lines:
    """The lines of a stream, read on a thread: waited for one by one, with a bound."""

    def __init__(self, stream: IO[str]) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.ended = threading.Event()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        try:
            for line in stream:
                self._queue.put(line)
        finally:
            self._queue.put(None)
            self.ended.set()

    def until(self, text: str) -> str:
        """The first line (from here) holding ``text``; fails at the stream's end or the bound."""
        while True:
            line = self._queue.get(timeout=WAIT_S)
            if line is None:
                raise AssertionError(f"the stream ended before {text!r}: {self.seen}")
            self.seen.append(line)
            if text in line:
                return line


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "my_worker.py").write_text(MODULE.format(word="old"))
    return tmp_path


@contextlib.contextmanager
def _reloader(
    project: Path, *arguments: str
) -> Iterator[tuple[subprocess.Popen[str], _Lines, _Lines]]:
    """``dev --reload my_worker:worker ARGUMENTS``: the process, its stdout and stderr lines.

    Stopped with SIGTERM on the way out, which must end it with 0.
    """
    command = [sys.executable, "-m", "async_task_api_worker", "dev", "--reload"]
    with subprocess.Popen(
        [*command, "my_worker:worker", *arguments],
        cwd=project,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "LOG_FORMAT": "json"},
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        out, err = _Lines(process.stdout), _Lines(process.stderr)
        try:
            yield process, out, err
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(WAIT_S)
            out.ended.wait(WAIT_S)
            err.ended.wait(WAIT_S)
        assert code == 0, err.seen


def test_a_change_to_the_module_restarts_the_worker_on_the_new_code(project: Path) -> None:
    (project / "inputs.jsonl").write_text('{"n": 1}\n')
    with _reloader(project, "inputs.jsonl") as (_, out, err):
        err.until("dev --reload: watching")  # up before the change, and it says so first
        assert '"said":"old-1"' in out.until('"type":"success"')
        (project / "my_worker.py").write_text(MODULE.format(word="new"))
        err.until("my_worker.py changed; restarting")
        # The file is read again from its start by the new worker: the same task, new code.
        assert '"said":"new-1"' in out.until('"type":"success"')


def test_stdin_lines_are_fed_again_to_each_new_worker(project: Path) -> None:
    with _reloader(project) as (process, out, err):
        assert process.stdin is not None
        err.until("dev --reload: watching")
        process.stdin.write('{"n": 1}\n')
        process.stdin.flush()
        assert '"said":"old-1"' in out.until('"type":"success"')
        (project / "my_worker.py").write_text(MODULE.format(word="new"))
        err.until("restarting")
        assert '"said":"new-1"' in out.until('"type":"success"')  # the kept line, again
        process.stdin.write('{"n": 2}\n')  # and the next ones, as they come
        process.stdin.flush()
        assert '"said":"new-2"' in out.until('"type":"success"')


def test_the_watched_roots_are_the_directory_and_the_modules_own(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "far_worker.py").write_text("")
    here = tmp_path / "here"
    here.mkdir()
    assert watched_roots(f"{elsewhere / 'far_worker.py'}:worker", here) == [
        here.resolve(),
        elsewhere.resolve(),
    ]
    (here / "near_worker.py").write_text("")
    assert watched_roots("near_worker:worker", here) == [here.resolve()]
    assert watched_roots("no_such_module:worker", here) == [here.resolve()]


SLOW = """
import asyncio

from pydantic import BaseModel

from async_task_api_worker import TaskContext, Worker


class Input(BaseModel):
    n: int


class Output(BaseModel):
    done: bool


worker = Worker("slow")


@worker.task(timeout=600)
async def handle(task_input: Input, ctx: TaskContext) -> Output:
    await asyncio.sleep(600)
    return Output(done=True)
"""


def test_a_worker_does_not_outlive_its_reloader(project: Path) -> None:
    # A closed terminal (SIGHUP) or a SIGKILL ends the reloader: its child, in a session of its
    # own, drains at once instead of running its task on as an orphan.
    (project / "my_worker.py").write_text(SLOW)
    env = {**os.environ, "LOG_FORMAT": "json", "WORKER_SHUTDOWN_GRACE_S": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "async_task_api_worker", "dev", "--reload", "my_worker:worker"],
        cwd=project,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    children: list[str] = []
    try:
        assert process.stdin is not None and process.stdout is not None
        assert process.stderr is not None
        out, err = _Lines(process.stdout), _Lines(process.stderr)
        err.until("dev --reload: watching")
        process.stdin.write('{"n": 1}\n')
        process.stdin.flush()
        out.until('"type":"started"')
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        assert children
        process.kill()
        process.wait(WAIT_S)
        # The child held the same stdout: it ends once the child is gone too.
        assert out.ended.wait(DRAIN_S), "the dev worker outlived its reloader"
    finally:
        for child in children:  # what a failure left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait(WAIT_S)
        for stream in (process.stdin, process.stdout, process.stderr):  # no reader holds them now
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]
