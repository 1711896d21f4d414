"""Real worker processes: the flags in supervised processes, one log line per connection retry."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import BROKER_HOST, BROKER_PORT, Queues, wait_for
from tests.integration.tcp_proxy import TcpProxy
from tests.integration.test_processes_on_rabbitmq import wait_ready

TARGET = "examples.count_words:worker"
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z [A-Z]+ +\S+ ")
OURS_AT_START = "Cannot reach the broker at "
CLIENTS = ("aiormq.", "aio_pika.")


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port bound but not listening: every connection to it is refused at once."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]


def json_lines(worker: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in worker.stdout().splitlines()]


def test_flags_reach_every_supervised_worker_process(queues: Queues, start_worker: Any) -> None:
    worker = start_worker(
        TARGET,
        queues.env(LOG_FORMAT="json", LOG_LEVEL="WARNING", WORKER_CONCURRENCY="1"),
        wait_connected=False,
        args=(
            "--processes",
            "2",
            "--concurrency",
            "3",
            "--log-format",
            "text",
            "--log-level",
            "info",
        ),
    )
    wait_ready(worker)  # each process logs its INFO "Connected to" line: LOG_LEVEL lost
    lines = worker.stdout().splitlines()
    assert all(TEXT_LINE.match(line) for line in lines), lines  # LOG_FORMAT lost too
    connected = [line for line in lines if " Connected to " in line]
    assert len(connected) == 2
    assert all(re.search(r", prefetch 3\b", line) for line in connected), connected
    assert sorted(re.findall(r"worker_process=(\d)", "\n".join(connected))) == ["1", "2"]


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_an_unreachable_broker_logs_one_line_per_retry(
    start_worker: Any, refused_port: int, level: str
) -> None:
    env = Queues("unused").env(BROKER_URL=f"amqp://guest:guest@127.0.0.1:{refused_port}/")
    worker = start_worker(TARGET, env, wait_connected=False, args=("--log-level", level))
    wait_for(lambda: worker.stdout().count(OURS_AT_START) >= 3, what="three retries")
    worker.stop()
    lines = json_lines(worker)
    ours = [line for line in lines if line["msg"].startswith(OURS_AT_START)]
    theirs = [line for line in lines if line["logger"].startswith(CLIENTS)]
    assert all(line["level"] == "WARNING" for line in ours)
    if level == "INFO":
        assert theirs == []
        return
    # At DEBUG the client's own line of each attempt shows, as DEBUG: one per attempt.
    assert {(line["logger"], line["level"]) for line in theirs} == {("aiormq.connection", "DEBUG")}
    assert len(ours) <= len(theirs) <= len(ours) + 1


def test_a_lost_broker_logs_one_line_per_reconnect_attempt(
    queues: Queues, start_worker: Any
) -> None:
    with TcpProxy(BROKER_HOST, BROKER_PORT) as proxy:
        env = queues.env(BROKER_URL=queues.url.replace(f":{BROKER_PORT}/", f":{proxy.port}/"))
        worker = start_worker(TARGET, env)
    # The proxy is gone, its port closed: every reconnect attempt is refused.
    reconnecting = "(count-words worker) closed (connection refused); reconnecting"
    wait_for(lambda: worker.stdout().count(reconnecting) >= 3, what="three reconnect attempts")
    worker.stop()
    lines = json_lines(worker)
    attempts = [line for line in lines if reconnecting in line["msg"]]
    assert all(line["level"] == "WARNING" for line in attempts)
    theirs = [
        line["msg"]
        for line in lines
        if line["msg"].startswith(("error when creating transport", "Connection attempt to "))
    ]
    assert theirs == []


def test_submit_to_an_unreachable_broker_logs_one_line_per_retry_and_tries_its_10_s(
    refused_port: int,
) -> None:
    import os
    import subprocess
    import sys
    import time

    env = Queues("unused").env(BROKER_URL=f"amqp://guest:guest@127.0.0.1:{refused_port}/")
    env.pop("LOG_LEVEL", None)
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "async_task_api_worker", "submit", "{}", "--service", "x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=os.getcwd(),
    )
    took_s = time.monotonic() - began
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines[-1].startswith("async-task-api-worker: the broker was not reachable within 10 s")
    logged = [json.loads(line) for line in lines[:-1]]
    assert logged and all(line["msg"].startswith(OURS_AT_START) for line in logged)
    assert took_s >= 10  # the last try is at the bound, not a backoff before it
