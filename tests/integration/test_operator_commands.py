"""The operator's commands on the real broker (docs/commands.md), with real worker processes.

``inspect`` lists the live workers of a service with the task one of them runs, and names a
frozen one (SIGSTOP) as not answering, within its bound; ``run --processes 2`` answers once per
process. ``purge`` asks, or purges at once with ``--yes``, and refuses without a terminal.
``reports --follow`` prints a report as it arrives and stops on SIGINT. ``--broker-url`` alone
(no ``BROKER_URL``) takes ``run``, ``submit``, ``cancel`` and these to a vhost of the test's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import select
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from async_task_api_worker.cli import main
from async_task_api_worker.cli.commands.operate import inspect_bound_s
from async_task_api_worker.protocol.reports import StartedReport
from async_task_api_worker.runtime.exit_codes import ExitCode
from tests.integration.conftest import RABBITMQCTL, REPO, Queues, _make_vhost, rabbitmqctl
from tests.integration.test_cli_on_rabbitmq import cli
from tests.polling import wait_for

HANGING = "tests.integration.workers:hanging"
#: inspect's bound in these tests: rabbitmqctl, which names the silent consumers, needs about
#: a second on a quiet machine, more on a busy one.
TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def own_vhost(broker: None) -> Iterator[str]:
    """A vhost of these tests' own (quorum queues by default), deleted after."""
    name = f"atw-ops-{uuid.uuid4().hex[:8]}"
    _make_vhost(name, quorum=True)
    yield name
    rabbitmqctl("delete_vhost", name)


@pytest.fixture
def ops(own_vhost: str) -> Queues:
    return Queues(own_vhost)


def flag_only_env(queues: Queues, **overrides: str) -> dict[str, str]:
    """The queues' environment without ``BROKER_URL``: the URL comes from ``--broker-url``."""
    env = queues.env(CONTROL_EXCHANGE_NAME=f"{queues.name}_control", **overrides)
    env.pop("BROKER_URL")
    return env


async def started(queues: Queues, service: str) -> str:
    """Submit one task and return its id once its ``started`` report came (it runs now)."""
    async with queues.client(service) as client:
        task_id = await client.submit({"seconds": 0})
        async for report in client.reports(task_id):
            if isinstance(report, StartedReport):
                return task_id
    raise AssertionError("no started report")


def inspect_in_process(
    queues: Queues, service: str, monkeypatch: pytest.MonkeyPatch, *extra: str
) -> tuple[int, float]:
    """``inspect`` in this process (its wall time is the command's, not Python's start-up)."""
    for name, value in flag_only_env(queues).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("BROKER_URL", raising=False)
    began = time.monotonic()
    # The tests' broker's own rabbitmqctl (a 4.x node's is not the one on PATH).
    broker = ["--rabbitmqctl", shlex.join(RABBITMQCTL)]
    code = main(["inspect", "--service", service, "--broker-url", queues.url, *broker, *extra])
    return code, time.monotonic() - began


def consumers(queues: Queues) -> int:
    """The consumers of ``queues``' input queue, as the broker lists them."""
    output = rabbitmqctl("list_queues", "-q", "-p", queues.vhost, "name", "consumers")
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == queues.in_queue:
            return int(parts[1])
    return 0


def test_inspect_lists_the_live_workers_and_names_the_frozen_one_within_its_bound(
    markers: Path,
    ops: Queues,
    start_worker: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Frozen workers keep their connection for two heartbeats; the test needs far less.
    env = ops.env(
        CONTROL_EXCHANGE_NAME=f"{ops.name}_control",
        BROKER_HEARTBEAT_S="120",
        ATW_TEST_MARKERS=str(markers),
        WORKER_SHUTDOWN_GRACE_S="1",  # the hanging task is given back at the stop, at once
    )
    first, second = start_worker(HANGING, env), start_worker(HANGING, env)
    task_id = asyncio.run(started(ops, "hanging"))
    frozen = start_worker(HANGING, env)  # after the task went out: it has none
    # "Connected to" comes before the worker's basic.consume: frozen before it, a loaded
    # machine's worker would be no consumer at all.
    wait_for(lambda: consumers(ops) == 3, what="three consumers on the input queue")
    frozen.signal(signal.SIGSTOP)
    try:
        code, elapsed_s = inspect_in_process(
            ops, "hanging", monkeypatch, "--json", "--timeout-s", str(TIMEOUT_S)
        )
        found = json.loads(capsys.readouterr().out)
        text_code, _ = inspect_in_process(
            ops, "hanging", monkeypatch, "--timeout-s", str(TIMEOUT_S)
        )
        table = capsys.readouterr().out
    finally:
        frozen.signal(signal.SIGCONT)
    assert code == text_code == ExitCode.FAILURE  # one did not answer
    assert elapsed_s <= inspect_bound_s(TIMEOUT_S)
    answered = {reply["pid"]: reply for reply in found["answered"]}
    assert set(answered) == {first.pid, second.pid}
    # One runs the task (whichever the broker gave it to), the other runs nothing.
    running = sorted((reply["tasks"] for reply in answered.values()), key=len)
    assert running[0] == []
    (task,) = running[1]
    assert (task["task_id"], task["attempt"]) == (task_id, 1) and task["elapsed_s"] > 0
    assert found["consumers"] == 3 and found["not_answering_count"] == 1
    (silent,) = found["not_answering"]
    assert silent["pid"] == frozen.pid
    assert f"NOT ANSWERING: host {silent['host']} pid {frozen.pid} " in table
    assert task_id in table


def test_each_process_of_run_processes_answers_for_itself(
    ops: Queues,
    start_worker: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pod = start_worker(
        HANGING, flag_only_env(ops), args=("--processes", "2", "--broker-url", ops.url),
        wait_connected=False,
    )  # fmt: skip
    wait_for(lambda: pod.log().count("Connected to") >= 2, 60, "two worker processes connected")
    code, _ = inspect_in_process(ops, "hanging", monkeypatch, "--json", "--timeout-s", "3")
    found = json.loads(capsys.readouterr().out)
    assert code == ExitCode.OK, found
    pids = {reply["pid"] for reply in found["answered"]}
    assert len(pids) == 2 and pod.pid not in pids  # the supervisor consumes nothing
    assert {reply["host"] for reply in found["answered"]} == {os.uname().nodename}
    for pid in pids:  # the URL reached them in their environment, not on their command line
        assert ops.url.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()


async def publish_tasks(queues: Queues, service: str, count: int) -> list[str]:
    """Publish ``count`` tasks (the queues declared first, as a worker would) and close."""
    client = queues.client(service)
    await client.connect()
    try:
        return [await client.submit({"seconds": 0}) for _ in range(count)]
    finally:
        await client.close()


def test_purge_with_yes_refuses_without_a_terminal_and_asks_on_one(ops: Queues) -> None:
    env = flag_only_env(ops)
    asyncio.run(publish_tasks(ops, "nobody", 3))  # no worker: they wait in the input queue
    purge = ("purge", "--service", "nobody", "--broker-url", ops.url)
    refused = cli(*purge, env=env)
    assert refused.returncode == ExitCode.CONFIG
    assert refused.stderr == (
        "async-task-api-worker: purge asks before it deletes: run it on a terminal, or give --yes\n"
    )
    ops.assert_counts(ops.in_queue, (3, 0))
    code, question = asked(purge, env, "n\n")
    assert code == 0
    assert f"Purge the 3 message(s) ready in {ops.in_queue} (service nobody)? [y/N]" in question
    ops.assert_counts(ops.in_queue, (3, 0))
    done = cli(*purge, "--yes", env=env)
    assert (done.returncode, done.stdout) == (0, f"purged 3 message(s) from {ops.in_queue}\n")
    ops.assert_drained(ops.in_queue)
    missing = cli(*purge, "--yes", env=env | {"IN_QUEUE_NAME": "nosuch_in"})
    assert missing.returncode == ExitCode.FAILURE
    assert "there is no queue nosuch_in" in missing.stderr


def asked(arguments: tuple[str, ...], env: dict[str, str], answer: str) -> tuple[int, str]:
    """Run ``arguments`` with a terminal on stdin and stderr; answer its question.

    Returns:
        Its exit code, and what it wrote to the terminal (the question).
    """
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "async_task_api_worker", *arguments],
        cwd=REPO, env=env, stdin=terminal, stdout=subprocess.PIPE, stderr=terminal,
    )  # fmt: skip
    os.close(terminal)
    seen = b""
    while b"[y/N]" not in seen:
        seen += os.read(controller, 4096)
    os.write(controller, answer.encode())
    with contextlib.suppress(OSError):  # EIO: the command ended and closed the terminal
        while chunk := os.read(controller, 4096):
            seen += chunk
    os.close(controller)
    process.communicate(timeout=60)
    return process.returncode, seen.decode()


def lines_until(stream: IO[str], wanted: str, timeout_s: float = 30.0) -> list[str]:
    """The lines ``stream`` gives until one holds ``wanted`` (AssertionError after timeout).

    Read from its descriptor, not its buffered reader: a readline may take several lines into
    the buffer, and a select on the descriptor would then wait for lines already read.
    """
    descriptor = stream.fileno()
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    pending = b""
    while not any(wanted in line for line in seen):
        if b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            seen.append(line.decode() + "\n")
            continue
        left = deadline - time.monotonic()
        ready, _, _ = select.select([descriptor], [], [], max(0.0, left))
        assert ready, f"{wanted!r} not in {seen}"
        chunk = os.read(descriptor, 65536)
        assert chunk, f"the stream ended before {wanted!r}: {seen}"
        pending += chunk
    assert not pending, f"lines after {wanted!r} would be lost: {pending!r}"
    return seen


def test_reports_follow_prints_a_report_as_it_arrives_and_stops_on_sigint(
    ops: Queues, start_worker: Any
) -> None:
    env = flag_only_env(ops)
    start_worker("examples.count_words:worker", ops.env())
    follower = subprocess.Popen(
        [sys.executable, "-m", "async_task_api_worker", "reports", "--service", "count-words",
         "--follow", "--broker-url", ops.url],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A shell gives its foreground command the default SIGINT: Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    )  # fmt: skip
    try:
        assert follower.stderr is not None and follower.stdout is not None
        (said,) = lines_until(follower.stderr, "CONSUMES")
        assert "the API will not see" in said and ops.out_queue in said
        (task_id,) = asyncio.run(publish_tasks_with_text(ops))
        printed = lines_until(follower.stdout, '"type":"success"')
        reports = [json.loads(line) for line in printed]
        assert {report["task_id"] for report in reports} == {task_id}
        assert reports[0]["type"] == "started"
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=30) == 130
        assert f"{len(reports)} report(s) printed and taken" in follower.stderr.read()
    finally:
        if follower.poll() is None:
            follower.kill()
        follower.communicate(timeout=30)  # closes its pipes
    ops.assert_drained(ops.out_queue)  # each printed report was acked


async def publish_tasks_with_text(queues: Queues) -> list[str]:
    client = queues.client("count-words")
    await client.connect(reports=False)
    try:
        return [await client.submit({"text": "hello big world"})]
    finally:
        await client.close()


def test_run_submit_and_cancel_take_the_broker_from_the_flag_alone(
    ops: Queues, start_worker: Any
) -> None:
    env = flag_only_env(ops)
    url = ("--broker-url", ops.url)
    start_worker("examples.count_words:worker", env, args=url)
    submitted = cli("submit", '{"text": "a b c"}', "--service", "count-words", *url, env=env)
    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(submitted.stdout.splitlines()[-1])["response"] == {"words": 3}
    cancelled = cli("cancel", "t-1", "--service", "count-words", *url, env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "reached nobody" not in cancelled.stderr  # the worker, on this vhost, was bound
    left = cli("reports", "--service", "count-words", *url, env=env)
    assert (left.returncode, left.stdout) == (0, "")  # submit took its reports
