"""The same handler raising the same exception is reported alike by every face.

In-process, in a process-isolated child, in a detached worker and in a Step Functions child,
the task call (``task_call``) concludes the handler: the same code and message, or the same
response, whatever face runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.detached import spawn_detached
from async_task_api_worker.testing import WorkerHarness
from tests.unit.faces.workers import inline, isolated

TARGET = "tests.unit.faces.workers:inline"
REPO = Path(__file__).resolve().parents[3]

# (code, message) of a failure, or ("", response JSON) of a success.
Seen = tuple[str, str]

EXPECTED: dict[str, Seen] = {
    "succeed": ("", '{"value": 42.0}'),
    "fatal": ("NOT_ALLOWED", "Not allowed for this account."),
    "retryable": ("UPSTREAM_BUSY", "The upstream is busy."),
    "internal": ("INTERNAL_ERROR", "the task failed with an internal error"),
    "invalid_result": (
        "INVALID_RESULT",
        "the handler's result failed its output model: value: float_parsing",
    ),
    "exit": ("INTERNAL_ERROR", "the task failed with an internal error"),
}


async def in_the_harness(mode: str, *, process: bool, timeout_s: float = 30) -> Seen:
    # One attempt: a retryable failure concludes at once, as it does in a detached worker.
    overrides = {"worker_delivery_limit": 1, "worker_task_timeout_s": timeout_s}
    async with WorkerHarness(
        isolated if process else inline, settings_overrides=overrides
    ) as harness:
        run = await harness.submit({"mode": mode})
    if run.error is not None:
        return run.error.code, run.error.message
    return "", json.dumps(run.response)


def in_a_detached_worker(mode: str, state: Path, timeout_s: float = 30) -> Seen:
    fields = {
        "task_id": f"t-{mode}",
        "client_id": "c",
        "service": "faces",
        "attempt": 1,
        "delivery_limit": 1,
    }
    work = {"input": {"mode": mode}, "context": {**fields, "input_refs": []}}
    spawn_detached(
        state, f"t-{mode}", work, handler=TARGET, deadline_s=timeout_s, meta=fields, sdk_worker=True
    )
    result_path = state / f"t-{mode}.json"
    deadline = time.monotonic() + 30
    while not result_path.exists():
        assert time.monotonic() < deadline, "no result from the detached worker"
        time.sleep(0.02)
    result: dict[str, Any] = json.loads(result_path.read_text())
    if result["ok"]:
        return "", json.dumps(result["response"])
    return result["error"]["code"], result["error"]["message"]


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
    output = json.loads(done.stdout)
    if done.returncode == 0:
        return "", json.dumps(output)
    assert done.returncode == 1, done.stderr
    return output["error"], output["message"]


@pytest.mark.parametrize("mode", sorted(EXPECTED))
async def test_every_face_reports_the_same_handler_alike(mode: str, tmp_path: Path) -> None:
    seen = {
        "in-process": await in_the_harness(mode, process=False),
        "process-isolated child": await in_the_harness(mode, process=True),
        "detached worker": in_a_detached_worker(mode, tmp_path / "state"),
        "Step Functions child": in_a_step_functions_child(mode),
    }
    assert seen == dict.fromkeys(seen, EXPECTED[mode])


async def test_a_timeout_is_reported_alike_where_the_face_keeps_the_deadline(
    tmp_path: Path,
) -> None:
    # A Step Functions child has no deadline of its own: its parent kills it.
    expected = ("TASK_TIMEOUT", "the task did not finish within 1 s")
    seen = {
        "in-process": await in_the_harness("hang", process=False, timeout_s=1),
        "process-isolated child": await in_the_harness("hang", process=True, timeout_s=1),
        "detached worker": in_a_detached_worker("hang", tmp_path / "state", timeout_s=1),
    }
    assert seen == dict.fromkeys(seen, expected)


async def test_a_result_that_is_not_json_is_reported_alike_by_the_worker_and_the_sfn_child() -> (
    None
):
    # A detached worker's result file takes it; its tick's report then fails as the worker's.
    expected = (
        "INVALID_RESULT",
        "the handler's result cannot be reported: value is not canonical JSON: ValueError",
    )
    assert await in_the_harness("nan", process=False) == expected
    assert await in_the_harness("nan", process=True) == expected
    assert in_a_step_functions_child("nan") == expected
