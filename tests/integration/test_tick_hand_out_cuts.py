"""The tick's hand-out is atomic (issue 30): killed at any step of it, the task still concludes.

Each case leaves one partial state of a hand-out in a state directory of its own: a real
``tick`` killed just before each step that changes the task's files (``cut_tick``: every file
created, written, renamed or removed, the worker's launcher before and after it), and, placed
by hand, the input alone (what the hand-out before issue 30 left when killed between its
input and its marker: the task was acked and never concluded). Then plain ticks run until
the task has a terminal report. Concluded means: exactly one terminal report (after a second
run if the hand-out had not committed), the input queue drained, and nothing left in the state
directory but the task's ``.done``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from async_task_api_worker.client import build_envelope
from async_task_api_worker.protocol.reports import decode_report
from tests.integration.conftest import REPO, Queues
from tests.integration.cut_tick import CUT_EXIT

TARGET = "tests.integration.workers:sleeping"
#: The task timeout: a marker whose worker never started is reported ``WORKER_DIED`` after it.
TIMEOUT_S = "3"
#: The longest a case may take to conclude, seconds (ticks of about 2 s, and the timeout).
CONCLUDE_WITHIN_S = 90.0
# A temporary or claimed name's maker and random part, left out to compare states.
_MADE_BY = re.compile(r"\.[0-9]+-[0-9]+-[0-9a-f-]+\.[0-9a-f]{8}\.tmp$")


def publish(queues: Queues, task_id: str) -> None:
    """Publish the envelope of ``task_id`` (a task of 0 s)."""

    async def send() -> None:
        connection = await aio_pika.connect(queues.url)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(queues.in_queue, durable=True)
            _, body = build_envelope({"seconds": 0}, service="sleeping", task_id=task_id)
            await channel.default_exchange.publish(
                aio_pika.Message(body), routing_key=queues.in_queue
            )

    asyncio.run(send())


def drain(queues: Queues) -> list[Any]:
    """The reports in the output queue now (taken)."""

    async def take() -> list[bytes]:
        connection = await aio_pika.connect(queues.url)
        bodies = []
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(queues.out_queue, durable=True)
            while (message := await queue.get(fail=False)) is not None:
                bodies.append(message.body)
                await message.ack()
        return bodies

    return [decode_report(body) for body in asyncio.run(take())]


def tick(queues: Queues, state: Path, markers: Path, *prefix: str) -> int:
    """Run one tick to its end (``prefix``: the module that runs it); its exit code."""
    return subprocess.run(
        [
            sys.executable, *(prefix or ("-m", "async_task_api_worker")), "tick", TARGET,
            "--state-dir", str(state), "--budget-s", "10", "--max-new", "1",
        ],
        cwd=REPO,
        env=queues.env(ATW_TEST_MARKERS=str(markers), WORKER_TASK_TIMEOUT_S=TIMEOUT_S),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=60,
        check=False,
    ).returncode  # fmt: skip


def left_in(state: Path) -> list[str]:
    """The state directory's names, a temporary file's maker and random part as ``*``."""
    if not state.is_dir():
        return []
    return sorted(_MADE_BY.sub(".*.tmp", path.name) for path in state.iterdir())


def concluded(queues: Queues, state: Path, markers: Path, task_id: str) -> list[Any]:
    """Run plain ticks until ``task_id`` has a terminal report, then one more; its reports."""
    reports: list[Any] = []
    deadline = time.monotonic() + CONCLUDE_WITHIN_S
    while not any(report.type in ("success", "failure") for report in reports):
        assert time.monotonic() < deadline, f"{task_id}: no terminal report, left {left_in(state)}"
        assert tick(queues, state, markers) == 0
        reports += drain(queues)
    assert tick(queues, state, markers) == 0  # nothing more comes out
    return reports + drain(queues)


def assert_concluded_once(
    queues: Queues, state: Path, markers: Path, task_id: str, left: list[str]
) -> str:
    """Conclude ``task_id`` with plain ticks and check it; its terminal report's type or code."""
    reports = concluded(queues, state, markers, task_id)
    terminal = [report for report in reports if report.type in ("success", "failure")]
    assert len(terminal) == 1, (left, [(report.type, report.attempt) for report in reports])
    queues.assert_drained(queues.in_queue)
    assert left_in(state) == [f"{task_id}.done"], left
    runs = len(list(markers.glob(f"{task_id}.*")))
    outcome = "success" if terminal[0].type == "success" else terminal[0].error.code
    assert runs == (1 if outcome == "success" else 0), (left, outcome, runs)  # never twice
    return str(outcome)


@pytest.mark.timeout(900)
def test_a_tick_killed_at_any_step_of_a_hand_out_leaves_a_task_the_next_ticks_conclude(
    queues: Queues, tmp_path: Path
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    cases: dict[str, tuple[list[str], str]] = {}
    for step in itertools.count():
        task_id = f"cut-{step}"
        state = tmp_path / task_id
        publish(queues, task_id)
        code = tick(queues, state, markers, "-m", "tests.integration.cut_tick", str(step), task_id)
        assert code in (CUT_EXIT, 0)
        left = [name.replace(task_id, "ID") for name in left_in(state)]
        outcome = assert_concluded_once(queues, state, markers, task_id, left)
        cases[f"cut before step {step}"] = (left, outcome)
        if code == 0:  # the hand-out had fewer steps: the whole tick ran
            break
    # The input alone, as the hand-out before issue 30 left it (written before the marker).
    state = tmp_path / "input-alone"
    state.mkdir()
    context = {"task_id": "input-alone", "client_id": "cli", "attempt": 1, "service": "sleeping"}
    message = {"input": {"seconds": 0}, "context": {**context, "input_refs": []}}
    (state / "input-alone.input").write_text(json.dumps(message))
    publish(queues, "input-alone")  # the tick was killed before its ack: it comes back
    outcome = assert_concluded_once(queues, state, markers, "input-alone", ["ID.input"])
    cases["the input alone"] = (["ID.input"], outcome)
    outcomes: dict[tuple[str, ...], set[str]] = {}
    for left, outcome in cases.values():
        outcomes.setdefault(tuple(left), set()).add(outcome)
    # Not handed out (no marker): it ran again. Every file of a hand-out alone, and each cut
    # write, were among the states.
    for left in ((), (".ID.input.*.tmp",), (".ID.input.*.tmp", ".ID.running.*.tmp"), ("ID.input",)):
        assert outcomes.get(left) == {"success"}, (left, cases)
    # Handed out (the marker, the commit), the worker not started: reported at the deadline;
    # the same files with the worker started (the launcher returned): its result.
    assert outcomes.get((".ID.input.*.tmp", "ID.running")) == {"WORKER_DIED"}, cases
    assert outcomes.get(("ID.input", "ID.log", "ID.running")) == {"WORKER_DIED", "success"}, cases
