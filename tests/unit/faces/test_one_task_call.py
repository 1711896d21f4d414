"""The same handler raising the same exception is reported alike by every face.

In-process (``async def`` on the event loop, ``def`` in a thread), in a process-isolated child,
in a detached worker and in a Step Functions child, the task call (``task_call``) concludes the
handler: the same code and message, or the same response, whatever face runs it. A child's
conclusion is read back with the one reader (``conclusion.conclusion_from_json``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from async_task_api_worker import Worker
from async_task_api_worker.conclusion import Conclusion, Failure, conclusion_from_json
from async_task_api_worker.detached import Marker
from async_task_api_worker.detached.state import INPUT_SUFFIX, MARKER_SUFFIX, RESULT_SUFFIX
from async_task_api_worker.detached.tick import TickReport, sweep_and_report
from async_task_api_worker.engine import Engine
from async_task_api_worker.executors import InlineExecutor
from async_task_api_worker.protocol import FailureReport
from async_task_api_worker.protocol.codes import RESERVED_ERROR_CODES
from async_task_api_worker.settings import load_settings
from async_task_api_worker.testing import WorkerHarness
from async_task_api_worker.transports.memory import InMemoryTransport
from tests.unit.faces.workers import RELEASE, inline, isolated, threaded

TARGET = "tests.unit.faces.workers:inline"
REPO = Path(__file__).resolve().parents[3]

# (code, message) of a failure, or ("", response JSON, keys sorted) of a success.
Seen = tuple[str, str]

EXPECTED: dict[str, Seen] = {
    "succeed": ("", '{"notes": [], "tags": {}, "value": 42.0}'),
    "fatal": ("NOT_ALLOWED", "Not allowed for this account."),
    "retryable": ("UPSTREAM_BUSY", "The upstream is busy."),
    "internal": ("INTERNAL_ERROR", "the task failed with an internal error"),
    "invalid_result": (
        "INVALID_RESULT",
        "the handler's result failed its output model: value: float_parsing",
    ),
    "exit": ("INTERNAL_ERROR", "the task failed with an internal error"),
}


@pytest.fixture(autouse=True)
def release_hanging_threads() -> Iterator[None]:
    RELEASE.clear()
    yield
    RELEASE.set()


def seen(conclusion: Conclusion) -> Seen:
    if isinstance(conclusion, Failure):
        return conclusion.code, conclusion.message
    return "", json.dumps(conclusion.value, sort_keys=True)


def read_back(document: object) -> Seen:
    return seen(conclusion_from_json(document, sdk_codes=RESERVED_ERROR_CODES))


async def in_the_harness(mode: str, worker: Worker, *, timeout_s: float = 30) -> Seen:
    # One attempt: a retryable failure concludes at once, as it does in a detached worker.
    overrides = {"worker_delivery_limit": 1, "worker_task_timeout_s": timeout_s}
    async with WorkerHarness(worker, settings_overrides=overrides) as harness:
        run = await harness.submit({"mode": mode})
    if run.error is not None:
        return run.error.code, run.error.message
    return "", json.dumps(run.response, sort_keys=True)


def in_a_detached_worker(mode: str, state: Path, timeout_s: float = 30) -> Seen:
    """The detached worker's process, as ``spawn_detached`` starts it, waited for to its end."""
    task_id = f"t-{mode}"
    fields = {"task_id": task_id, "client_id": "c", "service": "faces", "attempt": 1}
    fields["delivery_limit"] = 1
    state.mkdir(parents=True, exist_ok=True)
    work = {"input": {"mode": mode}, "context": {**fields, "input_refs": []}}
    (state / f"{task_id}{INPUT_SUFFIX}").write_text(json.dumps(work))
    (state / f"{task_id}{MARKER_SUFFIX}").write_bytes(
        Marker.new(task_id, timeout_s, fields).to_json()
    )
    arguments = ["--state-dir", str(state), "--correlation-id", task_id, "--handler", TARGET]
    subprocess.run(
        [sys.executable, "-m", "async_task_api_worker.detached", *arguments, "--sdk-worker"],
        cwd=REPO,
        capture_output=True,
        timeout=60,
        check=False,  # at its deadline it kills its own process group, itself included
    )
    return read_back(json.loads((state / f"{task_id}{RESULT_SUFFIX}").read_text()))


async def reported_by_a_tick(state: Path) -> Seen:
    """What the ``tick`` command's sweep reports for the result files in ``state``."""
    transport = InMemoryTransport()
    settings = load_settings({}, read_environment=False)
    engine = Engine(inline, settings, transport, InlineExecutor())
    via = transport.report_only()
    await sweep_and_report(engine, "faces", state, 30.0, TickReport(), via=via)
    (published,) = transport.published
    report = published.report.report
    if isinstance(report, FailureReport):
        return report.error.code, report.error.message
    return "", json.dumps(report.model_dump()["response"], sort_keys=True)


STEP_FUNCTIONS_CHILD = (
    "from async_task_api_worker.sfn.task_child import run_task\n"
    "from tests.unit.faces.workers import inline\n"
    "run_task(inline)\n"
)


def in_a_step_functions_child(mode: str) -> Seen:
    request = {"task_token": "token", "task_id": f"t-{mode}", "input": {"mode": mode}}
    done = subprocess.run(
        [sys.executable, "-c", STEP_FUNCTIONS_CHILD],
        cwd=REPO,
        env={**os.environ, "WORKER_REQUEST": json.dumps(request)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    code, message = read_back(json.loads(done.stdout))
    assert done.returncode == (1 if code else 0), done.stderr  # seed 000's exit codes
    return code, message


@pytest.mark.parametrize("mode", sorted(EXPECTED))
async def test_every_face_reports_the_same_handler_alike(mode: str, tmp_path: Path) -> None:
    seen = {
        "in-process, async def": await in_the_harness(mode, inline),
        "in-process, def": await in_the_harness(mode, threaded),
        "process-isolated child": await in_the_harness(mode, isolated),
        "detached worker": in_a_detached_worker(mode, tmp_path / "state"),
        "Step Functions child": in_a_step_functions_child(mode),
    }
    assert seen == dict.fromkeys(seen, EXPECTED[mode])


async def test_a_timeout_is_reported_alike_where_the_face_keeps_the_deadline(
    tmp_path: Path,
) -> None:
    # A Step Functions child has no deadline of its own: its parent kills it (tests/unit/sfn).
    expected = ("TASK_TIMEOUT", "the task did not finish within 1 s")
    seen = {
        "in-process, async def": await in_the_harness("hang", inline, timeout_s=1),
        "in-process, def": await in_the_harness("hang", threaded, timeout_s=1),
        "process-isolated child": await in_the_harness("hang", isolated, timeout_s=1),
        "detached worker": in_a_detached_worker("hang", tmp_path / "state", timeout_s=1),
    }
    assert seen == dict.fromkeys(seen, expected)


UNREPORTABLE = {
    "nan": "value is not canonical JSON: ValueError",
    "surrogate": "value is not valid Unicode: a lone surrogate U+D800 at notes.1",
    "surrogate_key": (
        "value is not valid Unicode: a lone surrogate U+DC00 in a key at tags.half \\udc00"
    ),
}


@pytest.mark.parametrize("mode", sorted(UNREPORTABLE))
async def test_a_result_no_report_can_carry_is_refused_alike_by_every_face(
    mode: str, tmp_path: Path
) -> None:
    # A detached worker's result file takes it (escaped, for a lone surrogate); the tick that
    # reports that file refuses it as the worker's report does.
    state = tmp_path / "state"
    in_a_detached_worker(mode, state)
    seen = {
        "in-process, async def": await in_the_harness(mode, inline),
        "in-process, def": await in_the_harness(mode, threaded),
        "process-isolated child": await in_the_harness(mode, isolated),
        "detached worker, then its tick": await reported_by_a_tick(state),
        "Step Functions child": in_a_step_functions_child(mode),
    }
    expected = ("INVALID_RESULT", f"the handler's result cannot be reported: {UNREPORTABLE[mode]}")
    assert seen == dict.fromkeys(seen, expected)
