r"""The peers' completion marks: one fixed-width line per finished task.

:func:`mark` appends ``f"{time.monotonic():020.6f}\n"`` (21 bytes) to the file named by
``BENCH_DONE_FILE``, with a single ``os.write`` on a descriptor opened with ``O_APPEND``, so
that threads and processes may share the file without tearing lines. The descriptor is opened
once per process (again in a forked child). ``time.monotonic`` is system-wide on Linux, so the
marks of several processes compare.

:func:`mark_start` does the same for a task's start, to the file named by ``BENCH_START_FILE``
when it is set (``bench.cold_start`` sets it; the throughput runs do not, and then it costs a
test of a module global).
"""

from __future__ import annotations

import os
import threading
import time

LINE_BYTES = 21

_lock = threading.Lock()
_fd: int | None = None
_fd_pid: int | None = None


def _descriptor() -> int:
    global _fd, _fd_pid  # noqa: PLW0603 - one descriptor per process
    pid = os.getpid()
    fd = _fd
    if fd is not None and _fd_pid == pid:
        return fd
    with _lock:
        if _fd is None or _fd_pid != pid:
            _fd = os.open(
                os.environ["BENCH_DONE_FILE"], os.O_APPEND | os.O_WRONLY | os.O_CREAT, 0o644
            )
            _fd_pid = pid
        return _fd


_START_FILE = os.environ.get("BENCH_START_FILE")


def mark() -> None:
    """Record that one task is done, with the time it finished."""
    os.write(_descriptor(), f"{time.monotonic():020.6f}\n".encode())


def mark_start() -> None:
    """Record that a task started, with the time, when ``BENCH_START_FILE`` is set."""
    if _START_FILE is None:
        return
    fd = os.open(_START_FILE, os.O_APPEND | os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{time.monotonic():020.6f}\n".encode())
    finally:
        os.close(fd)
