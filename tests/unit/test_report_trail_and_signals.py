"""A delivery's reports never land out of order across a reopened channel; a supervised
process takes its supervisor's death as one drain request, however often Linux says it."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from async_task_api_worker.protocol.reports import StartedReport, SuccessReport, encode_report
from async_task_api_worker.runtime import signals
from async_task_api_worker.transports.rabbitmq.reports import ReportTrail

REPO = Path(__file__).resolve().parents[2]

FIELDS = {
    "protocol_version": 1,
    "task_id": "t-1",
    "client_id": "c",
    "service": "svc",
    "attempt": 1,
    "timestamp": datetime(2026, 12, 1, tzinfo=UTC).isoformat().replace("+00:00", ".000000Z"),
}


def reports() -> tuple[object, object]:
    started = encode_report(StartedReport.model_construct(**FIELDS), seq=0)
    success = encode_report(SuccessReport.model_construct(**FIELDS, response={}), seq=1)
    return started, success


async def test_a_report_waits_while_its_predecessor_is_unconfirmed_on_a_closed_channel() -> None:
    started, success = reports()
    old, new = object(), object()
    trail = ReportTrail(channel=old, report=started)  # type: ignore[arg-type]
    assert trail.allows(success, old)  # behind it on the same channel: in order
    assert not trail.allows(success, new)  # on a new channel it would land without it
    assert trail.allows(started, new)  # the lost one itself goes again first
    trail.confirmed = True
    assert trail.allows(success, new)  # confirmed: any channel will do


async def supervisor_gone_requests() -> list[str]:
    """The drain requests of a supervised process whose supervisor dies, as Linux says it."""
    signals.drain_once_on(signals.SUPERVISOR_GONE)
    requests: list[str] = []
    arrived = asyncio.Event()

    def request(reason: str) -> None:
        requests.append(reason)
        arrived.set()

    with signals.shutdown_on_signals(request):
        os.kill(os.getpid(), signals.SUPERVISOR_GONE)
        await arrived.wait()
        os.kill(os.getpid(), signals.SUPERVISOR_GONE)  # Linux says it once per exiting thread
        os.kill(os.getpid(), signal.SIGTERM)  # a real SIGTERM still counts, as a second one
        while len(requests) < 2:
            arrived.clear()
            await arrived.wait()
        for _ in range(10):
            await asyncio.sleep(0)  # room for a third request, if one were made
    return requests


def test_the_supervisor_gone_signal_asks_for_one_drain_however_often_it_comes() -> None:
    # In a process of its own: drain_once_on holds for the rest of the process's life.
    script = (
        "import asyncio\n"
        "from tests.unit.test_report_trail_and_signals import supervisor_gone_requests\n"
        "print(asyncio.run(supervisor_gone_requests()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(["SIGUSR1: the supervisor is gone", "SIGTERM"])


async def test_the_same_signal_again_within_the_echo_window_is_the_same_request() -> None:
    """A terminal's Ctrl-C plus its forwarding by ``uv run``: one request, not two."""
    requests: list[str] = []
    counted, echoed = asyncio.Event(), asyncio.Event()
    now = [100.0]

    def request(reason: str) -> None:
        requests.append(reason)
        counted.set()

    class Echoes(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "the same request" in record.getMessage():
                echoed.set()

    async def send(number: signal.Signals, *, echo: bool) -> None:
        waited = echoed if echo else counted
        waited.clear()
        os.kill(os.getpid(), number)
        await asyncio.wait_for(waited.wait(), timeout=5)

    runtime_logger = logging.getLogger("async_task_api_worker.runtime")
    handler = Echoes()
    runtime_logger.addHandler(handler)
    previous_level = runtime_logger.level
    runtime_logger.setLevel(logging.INFO)
    try:
        with signals.shutdown_on_signals(request, clock=lambda: now[0]):
            await send(signal.SIGINT, echo=False)
            await send(signal.SIGINT, echo=True)  # the launcher's copy, at the same instant
            now[0] += signals.ECHO_WINDOW_S - 0.01
            await send(signal.SIGINT, echo=True)  # still within the window of the counted one
            now[0] += 0.02  # a deliberate second Ctrl-C, just past the window
            await send(signal.SIGINT, echo=False)
            await send(signal.SIGTERM, echo=False)  # another signal is never an echo
    finally:
        runtime_logger.removeHandler(handler)
        runtime_logger.setLevel(previous_level)
    assert requests == ["SIGINT", "SIGINT", "SIGTERM"]


async def test_an_echo_after_the_handlers_are_gone_does_not_end_the_process() -> None:
    """The launcher's copy of a last Ctrl-C that came after the drain ended: the process is on
    its way out with the drain's exit code, not KeyboardInterrupt's 130."""
    counted = asyncio.Event()
    now = [100.0]
    previous = signal.getsignal(signal.SIGINT)
    try:
        with signals.shutdown_on_signals(lambda _: counted.set(), clock=lambda: now[0]):
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.wait_for(counted.wait(), timeout=5)
        os.kill(os.getpid(), signal.SIGINT)  # the echo, handlers gone: ignored
        now[0] += signals.ECHO_WINDOW_S
        os.kill(os.getpid(), signal.SIGINT)  # an echo late under load: ignored all the same
        now[0] += signals.LATE_ECHO_WINDOW_S
        with pytest.raises(KeyboardInterrupt):  # a deliberate one later: as before the block
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)


ECHO_AT_EXIT = """
import asyncio, atexit, os, signal
from async_task_api_worker.runtime import signals

def finalizing() -> None:  # registered first, so it runs after the module's own exit hook
    print("ignored" if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else "handled")
    os.kill(os.getpid(), signal.SIGINT)  # the echo, on the way out: ignored

atexit.register(finalizing)

async def main() -> None:
    counted = asyncio.Event()
    with signals.shutdown_on_signals(lambda _: counted.set()):
        os.kill(os.getpid(), signal.SIGINT)
        await counted.wait()

asyncio.run(main())
"""


def test_an_echo_while_the_interpreter_finalizes_leaves_the_exit_code_alone() -> None:
    """Python puts back the default action of a handled signal as it finalizes: a launcher's
    echo then ended the process by SIGINT (130 under uv run); within the late-echo window the
    signal is ignored at the OS level from the atexit callbacks on."""
    done = subprocess.run(
        [sys.executable, "-c", ECHO_AT_EXIT],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ignored"), done.stderr
