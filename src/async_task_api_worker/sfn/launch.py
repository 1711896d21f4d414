"""How seed 000's subprocess starts: ``python -m async_task_api_worker.sfn.launch MODULE``.

The worker kills a subprocess's whole group when its message ends, but a worker killed with
SIGKILL (the OOM killer, ``kill -9``) can kill nothing, and the subprocess, with whatever it
started, would run on beside the retry Step Functions makes. So the group's leader is a small
supervisor: it asks Linux for SIGTERM when the worker dies (``PR_SET_PDEATHSIG``), forks the
module's process, and on that signal kills the whole group. Otherwise it waits for the module
and ends as it did (its exit code, or the same signal), so the worker reads the end exactly as
if it had run ``python -m MODULE``.

A frozen worker (SIGSTOP, a paused VM, a blocked event loop) is not dead, and Step Functions
retries its task once its heartbeats stop. With ``--lease=FD:SECONDS`` the supervisor forks the
group's lease watchdog first (``executors.process.lease.fence``): it kills the whole group once
the worker has not renewed the lease on ``FD`` for ``SECONDS``.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import sys
import traceback
from typing import NoReturn

from async_task_api_worker.executors.process.group import die_with_parent
from async_task_api_worker.executors.process.lease import fence, unfence

__all__ = ["main"]


def _run_module(module: str) -> NoReturn:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.argv = [module]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream: nothing more can be said
            stream.flush()
    os._exit(code)


def _kill_the_group(*_: object) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> NoReturn:
    """Supervise ``MODULE`` (see the module); exits as it did."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    lease: tuple[int, float] | None = None
    try:
        if arguments and arguments[0].startswith("--lease="):
            fd, _, seconds = arguments.pop(0).removeprefix("--lease=").partition(":")
            lease = int(fd), float(seconds)
    except ValueError:
        arguments = []
    if len(arguments) != 1:
        print(
            "usage: python -m async_task_api_worker.sfn.launch [--lease=FD:SECONDS] MODULE",
            file=sys.stderr,
        )
        os._exit(2)
    worker = os.getppid()
    signal.signal(signal.SIGTERM, _kill_the_group)
    die_with_parent(signal.SIGTERM)
    if os.getppid() != worker:  # the worker died before the request took hold
        _kill_the_group()
    watchdog: int | None = None
    if lease is not None:
        watchdog = fence(*lease)
        os.close(lease[0])  # the watchdog holds it: the module's process must not
    child = os.fork()
    if child == 0:
        _run_module(arguments[0])
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    if watchdog is not None:
        unfence(watchdog)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


if __name__ == "__main__":
    main()
