r"""The peers' completion marks: one fixed-width line per finished task.

:func:`mark` appends ``f"{time.monotonic():020.6f}\n"`` (21 bytes) to the file named by
``BENCH_DONE_FILE``, with a single ``os.write`` on a descriptor opened with ``O_APPEND``, so
that threads and processes may share the file without tearing lines. The descriptor is opened
once per process (again in a forked child). ``time.monotonic`` is system-wide on Linux, so the
marks of several processes compare.
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


def mark() -> None:
    """Record that one task is done, with the time it finished."""
    os.write(_descriptor(), f"{time.monotonic():020.6f}\n".encode())
