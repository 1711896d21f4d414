"""Process isolation with real child processes: kills, integrity, output, crashes, relays."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from async_task_api_worker.executors.process import ProcessExecutor
from async_task_api_worker.executors.process.executor import EXIT_GRACE_S, REAP_TIMEOUT_S
from async_task_api_worker.executors.process.output import OutputTail
from async_task_api_worker.observability.logging import configure_logging
from async_task_api_worker.ports import ProgressDropped
from async_task_api_worker.protocol.envelope import decode_envelope
from async_task_api_worker.runtime import Runner
from async_task_api_worker.settings import load_settings
from async_task_api_worker.testing import Outcome, WorkerHarness
from async_task_api_worker.transports.memory import InMemoryTransport
from tests.polling import until, wait_for
from tests.unit.process.workers import CANARY_URL, isolated, threaded


def processes_with(marker: str) -> list[int]:
    """Pids of live processes whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


async def test_a_timed_out_task_has_its_whole_group_killed(tmp_path: Path) -> None:
    marker = f"atw-grandchild-{uuid.uuid4().hex}"
    pid_file = tmp_path / "child.pid"
    timeout_s = 2.0
    async with WorkerHarness(
        isolated, settings_overrides={"worker_task_timeout_s": timeout_s}
    ) as harness:
        started = time.monotonic()
        run = await harness.submit(
            {"mode": "grandchildren", "marker": marker, "data": str(pid_file)}
        )
        elapsed = time.monotonic() - started
    assert run.outcome is Outcome.ACKED
    assert run.settlement.code == "TASK_TIMEOUT"
    # The deadline, then the kill and the reap (bounded), then the pipes (1 s at most).
    assert elapsed < timeout_s + REAP_TIMEOUT_S + 1.0 + 1.0
    pgid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert processes_with(marker) == []


def raw_body(data_json: str) -> bytes:
    """An envelope whose input ``data`` is the given JSON text, verbatim."""
    return (
        '{"protocol_version":1,"task_id":"t-raw","client_id":"c","service":"isolated",'
        f'"input":{{"mode":"digest","data":{data_json}}}}}'
    ).encode()


@pytest.mark.parametrize(
    "data_json",
    [
        json.dumps("a" * 100_000),
        json.dumps("b" * 300_000),
        json.dumps("é" * 70_000, ensure_ascii=False),
        '"before\\u0000after"',
        '"lone \\ud800 surrogate"',
        '{"nested": [1, 2.5, -0.0, 123456789012345678901234567890, {"k": null}]}',
    ],
    ids=["100KB", "300KB", "70000e-acute", "NUL", "lone-surrogate", "numbers"],
)
async def test_any_request_the_decoder_accepts_arrives_intact(data_json: str) -> None:
    body = raw_body(data_json)
    expected = decode_envelope(body, max_body_bytes=16 << 20).input["data"]
    digest = hashlib.sha256(json.dumps(expected, ensure_ascii=True, sort_keys=True).encode())
    async with WorkerHarness(isolated) as harness:
        run = await harness.submit_raw(body)
    assert run.message_types == ("started", "success")
    assert run.response is not None
    assert run.response["data"] == digest.hexdigest()


@pytest.mark.parametrize("mode", ["chatty", "fd1", "warn", "flood"])
async def test_output_of_the_handler_cannot_corrupt_or_block_the_result(mode: str) -> None:
    async with WorkerHarness(isolated) as harness:
        run = await harness.submit({"mode": mode, "data": "kept"})
    assert run.message_types == ("started", "success")
    assert run.response is not None
    assert run.response["data"] == "kept"


async def test_the_output_tail_is_bounded() -> None:
    tail = OutputTail("stderr", 1000)
    tail.start()
    os.write(tail.write_fd, b"a" * 5000 + b"END")
    tail.close_write_end()
    await tail.finish(5.0)
    assert tail.total == 5003
    assert len(tail.data) == 1000
    assert tail.data.endswith(b"END")
    assert tail.text() == ""  # the one line was cut: no part of it is shown


# The worker keeps the last 16,384 bytes: a padding that makes the line 10 bytes longer cuts
# the kept tail just after "amqp://wor", before the password.
@pytest.mark.parametrize(
    "padding", [0, 16384 + 10 - len(CANARY_URL) - 2], ids=["whole", "cut-inside-the-url"]
)
async def test_a_password_in_the_childs_stderr_reaches_no_log_line(
    caplog: pytest.LogCaptureFixture, padding: int
) -> None:
    caplog.set_level(logging.DEBUG)
    async with WorkerHarness(isolated) as harness:
        run = await harness.submit({"mode": "canary_then_segv", "data": str(padding)})
    assert run.settlement.code == "WORKER_CRASHED"
    tails = [r for r in caplog.records if "wrote" in r.getMessage() and "stderr" in r.getMessage()]
    assert tails and tails[0].levelno == logging.WARNING  # it died without an answer
    for record in caplog.records:
        assert "CANARY-s3cret" not in record.getMessage()
        assert "CANARY-s3cret" not in str(record.exc_text or "")


async def test_a_segfault_and_an_exit_without_result_fail_with_codes_of_their_own() -> None:
    async with WorkerHarness(isolated) as harness:
        segv = await harness.submit({"mode": "segv"})
        exit0 = await harness.submit({"mode": "exit0"})
        after = await harness.submit({"mode": "echo", "data": 1})
    assert (segv.message_types, segv.settlement.code) == (("started", "failure"), "WORKER_CRASHED")
    assert segv.error is not None and "SIGSEGV" in segv.error.message
    assert (exit0.message_types, exit0.settlement.code) == (
        ("started", "failure"),
        "INVALID_RESULT",
    )
    assert after.message_types == ("started", "success")


async def test_task_errors_map_as_in_process(caplog: pytest.LogCaptureFixture) -> None:
    async with WorkerHarness(isolated) as harness:
        fatal = await harness.submit({"mode": "fatal"})
        retry = await harness.submit({"mode": "retry"})
        crash = await harness.submit({"mode": "crash", "data": "hunter2"})
        bad = await harness.submit({"mode": "bad_result"})
    assert fatal.settlement.code == "NOT_ALLOWED"
    assert (retry.outcome, retry.settlement.code) == (Outcome.NACKED_REQUEUE, "BUSY")
    assert crash.settlement.code == "INTERNAL_ERROR"
    assert crash.error is not None
    assert crash.error.message == "the task failed with an internal error"
    assert bad.settlement.code == "INVALID_RESULT"
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "ValueError" in logged and "workers.py" in logged
    assert "hunter2" not in logged


async def test_resource_limits_are_crashes() -> None:
    async with WorkerHarness(isolated) as harness:
        hog = await harness.submit({"mode": "hog"})
        spin = await harness.submit({"mode": "spin"})
    assert hog.settlement.code == "WORKER_CRASHED"
    assert hog.error is not None and "memory limit" in hog.error.message
    assert spin.settlement.code == "WORKER_CRASHED"
    assert spin.error is not None and "SIGXCPU" in spin.error.message


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    root.handlers.clear()
    configure_logging("INFO", stream=stream)
    yield stream
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


async def test_progress_and_logs_of_the_child_reach_the_worker(json_logs: io.StringIO) -> None:
    async with WorkerHarness(
        isolated, settings_overrides={"worker_progress_min_interval_s": 0.001}
    ) as harness:
        run = await harness.submit({"mode": "progress"}, task_id="t-progress")
        events = list(harness.events)
    assert run.message_types == ("started", "progress", "success")
    (progress,) = [r for r in run.messages if r.type == "progress"]
    assert (progress.fraction, progress.payload) == (0.25, {"step": 1})  # type: ignore[union-attr]
    assert ProgressDropped("backwards") in events
    lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    relayed = {
        line["msg"]: line for line in lines if line["logger"] != "async_task_api_worker.engine"
    }
    assert relayed["child says hello"]["task_id"] == "t-progress"
    assert relayed["library in the child"]["task_id"] == "t-progress"
    assert relayed["library in the child"]["level"] == "WARNING"


async def test_a_def_handler_runs_isolated_too() -> None:
    async with WorkerHarness(
        threaded, settings_overrides={"worker_progress_min_interval_s": 0.001}
    ) as harness:
        run = await harness.submit({"data": "x"})
    assert run.message_types == ("started", "progress", "success")
    assert run.response is not None and run.response["pid"] != os.getpid()


def task_body(task_id: str, task_input: dict[str, object]) -> bytes:
    return json.dumps(
        {
            "protocol_version": 1,
            "task_id": task_id,
            "client_id": "c",
            "service": isolated.name,
            "input": task_input,
        }
    ).encode()


def fork_servers() -> list[int]:
    """Pids of this process's children that are fork servers
    (``python -m async_task_api_worker.executors.process forkserver FD``)."""
    found = []
    for pid in processes_with("forkserver"):
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if parent == os.getpid():
            found.append(pid)
    return found


async def test_without_the_fork_server_each_task_spawns_a_fresh_interpreter() -> None:
    executor = ProcessExecutor(isolated.task_definition, use_fork_server=False)
    transport = InMemoryTransport()
    runner = Runner(
        isolated, load_settings({}, read_environment=False), transport, executor=executor
    )
    serving = asyncio.create_task(runner.serve())
    transport.put(task_body("t-fresh", {"mode": "echo", "data": "spawned"}))
    await transport.join()
    runner.request_shutdown("test")
    await serving
    await executor.aclose()
    [started, success] = [p.report for p in transport.published]
    assert (started.type, success.type) == ("started", "success")
    assert json.loads(success.body)["response"]["data"] == "spawned"
    assert (executor.spawned_fresh, executor.spawned_by_fork_server) == (1, 0)
    assert fork_servers() == []


async def test_a_fork_server_that_dies_is_replaced_or_bypassed() -> None:
    executor = ProcessExecutor(isolated.task_definition)
    transport = InMemoryTransport()
    runner = Runner(
        isolated, load_settings({}, read_environment=False), transport, executor=executor
    )
    serving = asyncio.create_task(runner.serve())
    transport.put(task_body("t-1", {"mode": "echo", "data": 1}))
    await transport.join()
    [server] = fork_servers()
    os.kill(server, signal.SIGKILL)
    # reaped by the executor once it notices
    await until(lambda: server not in fork_servers(), 10, "the killed fork server to go")
    transport.put(task_body("t-2", {"mode": "echo", "data": 2}))
    await transport.join()
    runner.request_shutdown("test")
    await serving
    await executor.aclose()
    assert [p.report.type for p in transport.published] == [
        "started", "success", "started", "success"
    ]  # fmt: skip
    assert executor.spawned_by_fork_server + executor.spawned_fresh == 2


async def test_a_cancelled_execution_kills_the_group(tmp_path: Path) -> None:
    marker = f"atw-cancel-{uuid.uuid4().hex}"
    pid_file = tmp_path / "child.pid"
    async with WorkerHarness(isolated) as harness:
        submitting = asyncio.ensure_future(
            harness.submit({"mode": "grandchildren", "marker": marker, "data": str(pid_file)})
        )
        await until(lambda: len(processes_with(marker)) >= 2, 30, "the grandchildren")
        submitting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await submitting
    with pytest.raises(ProcessLookupError):
        os.killpg(int(pid_file.read_text()), 0)
    assert processes_with(marker) == []
    assert EXIT_GRACE_S > 0


HANG_SCRIPT = """
import asyncio, sys
from async_task_api_worker.testing import WorkerHarness
from tests.unit.process.workers import isolated

async def main():
    async with WorkerHarness(isolated) as harness:
        await harness.submit({"mode": "grandchildren", "marker": sys.argv[1], "data": sys.argv[2]})

asyncio.run(main())
"""


def test_a_worker_killed_with_sigkill_leaves_no_task_process(tmp_path: Path) -> None:
    marker = f"atw-orphan-{uuid.uuid4().hex}"
    worker = subprocess.Popen(
        [sys.executable, "-c", HANG_SCRIPT, marker, str(tmp_path / "child.pid")],
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        wait_for(
            lambda: worker.poll() is not None or len(processes_with(marker)) >= 2,
            30,
            "the task's grandchildren",
        )
        assert worker.poll() is None
    finally:
        worker.kill()
        worker.wait()
    # The fork server sees its control socket end and kills every task's group.
    wait_for(lambda: not processes_with(marker), 10, lambda: f"{processes_with(marker)} to end")


async def test_results_up_to_the_report_limit_pass_and_larger_ones_are_too_large() -> None:
    async with WorkerHarness(isolated) as harness:
        big = await harness.submit({"mode": "huge", "data": 2_000_000})  # 4 MB, 12 MB escaped
        huge = await harness.submit({"mode": "huge", "data": 9_000_000})  # 18 MB of UTF-8
    assert big.message_types == ("started", "success")
    assert huge.settlement.code == "RESULT_TOO_LARGE"


async def test_a_dead_child_is_noticed_even_when_a_descendant_holds_the_channel() -> None:
    started = time.monotonic()
    async with WorkerHarness(isolated) as harness:
        run = await harness.submit({"mode": "fork_then_segv"})
    assert run.settlement.code == "WORKER_CRASHED"
    assert time.monotonic() - started < 10  # not the 30 s timeout


async def test_a_forged_message_from_the_child_is_an_invalid_result() -> None:
    async with WorkerHarness(isolated) as harness:
        run = await harness.submit({"mode": "forge"})
    assert run.settlement.code == "INVALID_RESULT"
    assert run.outcome is Outcome.ACKED


UNGUARDED = """
from pydantic import BaseModel
from async_task_api_worker import SyncTaskContext, Worker

class Nothing(BaseModel):
    pass

worker = Worker("unguarded")

@worker.task(timeout=5, isolation="process")
def handle(task_input: Nothing, ctx: SyncTaskContext) -> Nothing:
    return Nothing()

worker.run()  # no `if __name__ == "__main__":` guard
"""


def test_a_script_without_a_main_guard_stops_the_worker_with_one_line(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    done = subprocess.run(
        [sys.executable, str(script)],
        env={
            **os.environ,
            "HEALTH_CHECK_PORT": "0",
            "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot load the handler" in lines[0], done.stderr


async def test_a_raw_surrogate_pair_in_a_result_is_invalid_as_in_process() -> None:
    # Issue 30's one Unicode rule: two lone surrogates side by side (raw, in a Python str) are
    # INVALID_RESULT in-process; the child's JSON escapes them as a pair, which reads back
    # joined into one valid character, so the child must check before it sends.
    async with WorkerHarness(isolated) as harness:
        run = await harness.submit({"mode": "surrogate_pair"})
    assert run.settlement.code == "INVALID_RESULT", run.message_types
