"""Process-isolated workers for the executor tests (module level: the children find them)."""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from typing import Any, Literal

from pydantic import BaseModel

from async_task_api_worker import FatalError, RetryableError, SyncTaskContext, TaskContext, Worker

#: A URL with a password, written to stderr by the ``canary_then_segv`` mode.
CANARY_URL = b"amqp://worker:CANARY-s3cret@broker:5672/vhost"


class Job(BaseModel):
    """What to do; ``data`` is echoed back to check the request arrived intact."""

    mode: Literal[
        "echo",
        "digest",
        "grandchildren",
        "chatty",
        "fd1",
        "warn",
        "flood",
        "segv",
        "exit0",
        "progress",
        "fatal",
        "retry",
        "crash",
        "hog",
        "spin",
        "sleep",
        "bad_result",
        "huge",
        "fork_then_segv",
        "forge",
        "canary_then_segv",
        "once",
        "surrogate_pair",
        "unfenced",
    ] = "echo"
    data: Any = None
    marker: str = ""


class Echo(BaseModel):
    """The data, as the child saw it, and its process ids."""

    data: Any = None
    pid: int = 0


isolated = Worker("isolated")


@isolated.task(timeout=30, isolation="process", memory_limit_bytes=1 << 30, cpu_limit_s=2)
async def run(job: Job, ctx: TaskContext) -> Echo:  # noqa: PLR0912 - one branch per mode
    """Do what ``job.mode`` says, in the task's own process."""
    if job.mode == "digest":
        text = json.dumps(job.data, ensure_ascii=True, sort_keys=True)
        return Echo(data=hashlib.sha256(text.encode()).hexdigest(), pid=os.getpid())
    if job.mode == "grandchildren":
        with open(job.data, "w") as pid_file:
            pid_file.write(str(os.getpid()))
        for _ in range(2):
            subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(300)", job.marker],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        time.sleep(600)  # until its process group is killed, grandchildren and all
    elif job.mode == "chatty":
        print("before computing")
        value = sum(range(1000))
        print("after computing", value)
    elif job.mode == "fd1":
        os.write(1, b'{"t":"result","value":{"data":"forged"}}\n')
    elif job.mode == "warn":
        warnings.warn("a library warning", UserWarning, stacklevel=1)
    elif job.mode == "flood":
        chunk = b"x" * 65536 + b"\n"
        for _ in range(160):  # 10 MB
            os.write(2, chunk)
    elif job.mode == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif job.mode == "canary_then_segv":
        # The canary, then padding: a long enough padding cuts the kept tail inside the URL.
        os.write(2, CANARY_URL + b" " + b"y" * int(job.data) + b"\n")
        os.kill(os.getpid(), signal.SIGSEGV)
    elif job.mode == "exit0":
        os._exit(0)
    elif job.mode == "progress":
        await ctx.progress(0.25, {"step": 1})
        await ctx.progress(0.1)  # backwards: dropped in the child, counted in the worker
        ctx.logger.info("child says hello")
        logging.getLogger("some.lib").warning("library in the child")
    elif job.mode == "fatal":
        raise FatalError("NOT_ALLOWED", "Not allowed.")
    elif job.mode == "retry":
        raise RetryableError("BUSY", "Busy.", retry_delay_s=0.0)
    elif job.mode == "crash":
        raise ValueError(f"secret {job.data}")
    elif job.mode == "hog":
        hog = bytearray(2 << 30)
        return Echo(data=len(hog))
    elif job.mode == "spin":
        while True:
            pass
    elif job.mode == "once":
        # The first run leaves its pid (its group's id) in ``marker`` and works ``data``
        # seconds; a later run answers at once.
        if not os.path.exists(job.marker):
            with open(job.marker + ".tmp", "w") as pid_file:
                pid_file.write(str(os.getpid()))
            os.replace(job.marker + ".tmp", job.marker)
            time.sleep(float(job.data))
    elif job.mode == "unfenced":
        # Kills its own child processes (the lease's watchdog among them: a clean-up some
        # libraries do), leaves its pid in ``marker`` and sleeps ``data`` seconds: nothing in
        # the group reads the renewals any more (docs/isolation.md, "runs unfenced").
        me = os.getpid()
        with open(f"/proc/{me}/task/{me}/children") as children:
            for child in children.read().split():
                os.kill(int(child), signal.SIGKILL)
                os.waitpid(int(child), 0)
        with open(job.marker + ".tmp", "w") as pid_file:
            pid_file.write(str(me))
        os.replace(job.marker + ".tmp", job.marker)
        time.sleep(float(job.data))
    elif job.mode == "sleep":
        if job.marker:  # a file that says the request reached the task's process
            with open(job.marker, "w"):
                pass
        time.sleep(float(job.data))
    elif job.mode == "huge":
        return Echo(data="é" * int(job.data))
    elif job.mode == "fork_then_segv":
        if os.fork() == 0:  # a descendant that keeps the channel open
            time.sleep(60)
            os._exit(0)
        os.kill(os.getpid(), signal.SIGSEGV)
    elif job.mode == "forge":
        from async_task_api_worker.executors.process.channel import ChildChannel

        (channel,) = [o for o in gc.get_objects() if isinstance(o, ChildChannel)]
        channel.send({"t": "progress", "fraction": 0.5, "payload": [1, 2]})
        time.sleep(60)  # still running after the forged message, until the timeout ends it
    elif job.mode == "surrogate_pair":
        # Two lone surrogates side by side, raw: JSON's escapes would join them into one.
        return Echo(data="a\ud83d\ude00b", pid=os.getpid())
    elif job.mode == "bad_result":
        return {"data": object()}  # type: ignore[return-value]
    return Echo(data=job.data, pid=os.getpid())


threaded = Worker("isolated-def")


@threaded.task(timeout=30, isolation="process")
def run_sync(job: Job, ctx: SyncTaskContext) -> Echo:
    """A ``def`` handler, isolated too."""
    ctx.progress(0.5)
    return Echo(data=job.data, pid=os.getpid())
