"""``dev --reload``: the dev worker, restarted whenever a Python file it may import changes.

The reloader runs each dev worker as a child process (``dev TARGET FILE`` without
``--reload``) and watches, with watchfiles, the ``.py`` files under the current directory and
under the worker module's own directory: a change stops the child (SIGTERM: it drains as
``dev`` does) and starts a new one on the new code.

The input across restarts: each child gets the whole input. A FILE is read again from its
start by each child, so that a change re-runs the same tasks on the new code. Stdin is read
once, by the reloader: its lines are kept, fed to each new child from the first, then the ones
that follow as they come; at its end, each child's input ends after them. A child that ends (its
input done, or a module that does not import) leaves the reloader waiting for the next change.
SIGINT, SIGTERM or SIGHUP stops the child, then the reloader; a second one (past a launcher's
echo, ``runtime.signals.ECHO_WINDOW_S``) is handed on, and ends the child's grace period. A
child drains when the reloader dies (``PR_SET_PDEATHSIG``, as a supervised worker process does):
none is left orphaned by a closed terminal or a SIGKILL.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import IO, Final

from async_task_api_worker.runtime.exit_codes import ExitCode, say_error
from async_task_api_worker.runtime.signals import ECHO_WINDOW_S
from async_task_api_worker.setting_flags import flag_arguments

__all__ = ["RELOADER_ENV", "reload_command", "watched_roots"]

#: Set in each child's environment to the reloader's pid: the child drains when it dies.
RELOADER_ENV: Final = "ATW_DEV_RELOADER_PID"

#: Milliseconds between two looks at the reloader's own state while no file changes.
_TICK_MS: Final = 200
#: Seconds a stopped child gets to drain before it is killed.
_STOP_S: Final = 30.0


def watched_roots(target: str, cwd: Path) -> list[Path]:
    """Where a change restarts the worker: ``cwd``, and the worker module's directory.

    The module is found without being imported (``importlib.util.find_spec``; a package's
    parents are imported); one that cannot be found adds nothing (the child will say why).
    """
    roots = [cwd.resolve()]
    module, _, _ = target.rpartition(":")
    origin: str | None = None
    if module.endswith(".py"):
        origin = module
    else:
        sys.path.insert(0, str(cwd))
        try:
            spec = importlib.util.find_spec(module)
            origin = None if spec is None else spec.origin
        except (ImportError, ValueError):
            origin = None
        finally:
            sys.path.remove(str(cwd))
    if origin:
        folder = Path(origin).resolve().parent
        if not any(folder.is_relative_to(root) for root in roots):
            roots.append(folder)
    return roots


class _Input:
    """Feeds each child the whole input: stdin's lines kept, or FILE read by the child."""

    def __init__(self, path: str) -> None:
        self.stdin = path == "-"
        self._lines: list[str] = []
        self._ended = False
        self._child: IO[str] | None = None
        self._lock = threading.Lock()

    def start_reading(self) -> None:
        if self.stdin:
            threading.Thread(target=self._read, name="dev-reload-input", daemon=True).start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in iter(sys.stdin.readline, ""):
                with self._lock:
                    self._lines.append(line)
                    self._write(line)
        with self._lock:
            self._ended = True
            self._close()

    def attach(self, child_stdin: IO[str] | None) -> None:
        """Feed a new child: every line so far, and the end if the input ended."""
        with self._lock:
            self._close()
            self._child = child_stdin
            for line in self._lines:
                self._write(line)
            if self._ended:
                self._close()

    def _write(self, line: str) -> None:
        if self._child is None:
            return
        try:
            self._child.write(line)
            self._child.flush()
        except (OSError, ValueError):  # the child is gone: the next one gets the line
            self._child = None

    def _close(self) -> None:
        if self._child is not None:
            with contextlib.suppress(OSError, ValueError):
                self._child.close()
            self._child = None


def _start(target: str, path: str, flags: Mapping[str, str], feed: _Input) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "async_task_api_worker", "dev", target, path]
    child = subprocess.Popen(  # noqa: S603 - our own interpreter and module
        [*command, *flag_arguments(flags)],
        stdin=subprocess.PIPE if feed.stdin else subprocess.DEVNULL,
        text=True,
        env={**os.environ, RELOADER_ENV: str(os.getpid())},
        start_new_session=True,  # a Ctrl-C reaches the reloader alone, which stops the child
    )
    feed.attach(child.stdin)
    return child


def _stop(child: subprocess.Popen[str]) -> int:
    if child.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGTERM)
        try:
            child.wait(_STOP_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return child.returncode


def reload_command(target: str, path: str, *, flags: Mapping[str, str] | None = None) -> int:
    """Run ``dev target path``, restarted on each change of a watched ``.py`` file.

    Returns:
        0 once stopped by SIGINT or SIGTERM.

    Raises:
        ConfigError: never; a missing ``watchfiles`` or an unreadable FILE exits 2 (the
            returned code), with one line.
    """
    try:
        import watchfiles
    except ImportError:
        say_error("dev --reload needs watchfiles (the SDK's `reload` extra)")
        return ExitCode.CONFIG
    if path != "-" and not os.access(path, os.R_OK):
        say_error(f"cannot read {path}")
        return ExitCode.CONFIG
    stop = threading.Event()
    child: subprocess.Popen[str] | None = None
    stopped_at = [0.0]

    def on_signal(number: int, frame: FrameType | None) -> None:
        if not stop.is_set():
            stopped_at[0] = time.monotonic()
            stop.set()
        elif child is not None and time.monotonic() - stopped_at[0] >= ECHO_WINDOW_S:
            with contextlib.suppress(ProcessLookupError):  # a second request: no grace left
                child.send_signal(signal.SIGTERM)

    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, on_signal)
    roots = watched_roots(target, Path.cwd())
    feed = _Input(path)
    flags = dict(flags or {})
    for changes in watchfiles.watch(
        *roots,
        watch_filter=watchfiles.PythonFilter(),
        stop_event=stop,
        rust_timeout=_TICK_MS,
        yield_on_timeout=True,
    ):
        if child is None:  # the watcher is up: nothing it should see is missed from here
            print(f"dev --reload: watching {', '.join(map(str, roots))}", file=sys.stderr)
            feed.start_reading()
            child = _start(target, path, flags, feed)
        elif changes and not stop.is_set():
            names = sorted({Path(name).name for _, name in changes})
            print(f"dev --reload: {', '.join(names)} changed; restarting", file=sys.stderr)
            _stop(child)
            child = _start(target, path, flags, feed)
    if child is not None:
        _stop(child)
    return ExitCode.OK
