"""Fixtures for the integration tests: the RabbitMQ broker, vhosts, queues, worker processes.

The broker is the machine's (127.0.0.1:5672, ``rabbitmqctl``) unless the environment names
another one (docs/brokers.md; ``scripts/rabbitmq_nodes.py`` starts such nodes):

- ``ATW_RABBITMQ_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/``): host, port and
  credentials of the broker; the tests append their vhosts;
- ``ATW_RABBITMQCTL`` (default ``rabbitmqctl``): the command, shell-split, that runs that
  broker's ``rabbitmqctl``. The session checks that it manages a broker listening on the URL's
  port.

A session vhost is created with ``--default-queue-type quorum`` and a ``delivery-limit`` policy
above ``WORKER_DELIVERY_LIMIT`` (as the platform sets them), and deleted afterwards; each test
gets its own queue names. Without a reachable broker the tests skip, except under ``CI=true``,
where they fail. The ``rabbitmq_version`` fixture tells tests which broker version they run on.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.client import TaskClient
from tests.integration.sfn_fixtures import aws, ecs_agent, moto_url, sfn_worker
from tests.polling import wait_for

__all__ = ["aws", "ecs_agent", "moto_url", "sfn_worker"]  # fixtures of the sfn tests

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672/"
BROKER_URL = os.environ.get("ATW_RABBITMQ_URL") or DEFAULT_BROKER_URL
RABBITMQCTL = shlex.split(os.environ.get("ATW_RABBITMQCTL") or "rabbitmqctl")
_BROKER = urllib.parse.urlsplit(BROKER_URL)
BROKER_SCHEME = _BROKER.scheme or "amqp"
BROKER_HOST = _BROKER.hostname or "127.0.0.1"
BROKER_PORT = _BROKER.port or (5671 if BROKER_SCHEME == "amqps" else 5672)
BROKER_USER = urllib.parse.unquote(_BROKER.username or "guest")
BROKER_PASSWORD = urllib.parse.unquote(_BROKER.password or "guest")
QUEUE_DELIVERY_LIMIT = 20


def broker_url(vhost: str = "", *, user: str | None = None, password: str | None = None) -> str:
    """The URL of ``vhost`` on the tests' broker (``ATW_RABBITMQ_URL``), other credentials
    if given."""
    credentials = ":".join(
        urllib.parse.quote(part, safe="")
        for part in (user or BROKER_USER, BROKER_PASSWORD if password is None else password)
    )
    host = f"[{BROKER_HOST}]" if ":" in BROKER_HOST else BROKER_HOST
    path = urllib.parse.quote(vhost, safe="")
    return f"{BROKER_SCHEME}://{credentials}@{host}:{BROKER_PORT}/{path}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.integration)


def _broker_reachable() -> bool:
    try:
        with socket.create_connection((BROKER_HOST, BROKER_PORT), timeout=2):
            return True
    except OSError:
        return False


def rabbitmqctl(*arguments: str) -> str:
    """Run the broker's ``rabbitmqctl`` (``ATW_RABBITMQCTL``) and return its output."""
    done = subprocess.run(
        [*RABBITMQCTL, *arguments], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(arguments)}: {done.stderr.strip()}")
    return done.stdout


@pytest.fixture(scope="session")
def broker_status() -> dict[str, Any]:
    """``rabbitmqctl status`` of the tests' broker: skip without a broker, fail under CI=true.

    Fails when ``ATW_RABBITMQCTL`` does not reach the broker, or reaches one that does not
    listen on ``ATW_RABBITMQ_URL``'s port (the two must name the same broker).
    """
    if not _broker_reachable():
        message = f"RabbitMQ is not reachable on {BROKER_HOST}:{BROKER_PORT}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: integration tests must run)")
        pytest.skip(message)
    try:
        status: dict[str, Any] = json.loads(rabbitmqctl("status", "--formatter", "json"))
    except RuntimeError as error:
        pytest.fail(f"{shlex.join(RABBITMQCTL)} does not reach the broker: {error}")
    ports = {listener.get("port") for listener in status.get("listeners", [])}
    if BROKER_PORT not in ports:
        pytest.fail(
            f"{shlex.join(RABBITMQCTL)} manages a broker listening on {sorted(ports)}, "
            f"not on {BROKER_PORT} (ATW_RABBITMQ_URL and ATW_RABBITMQCTL must agree)"
        )
    return status


@pytest.fixture(scope="session")
def broker(broker_status: dict[str, Any]) -> None:
    """The tests' RabbitMQ: skip without it, fail under CI=true."""


@pytest.fixture(scope="session")
def rabbitmq_version(broker_status: dict[str, Any]) -> tuple[int, ...]:
    """The broker's version, e.g. ``(3, 10, 8)`` or ``(4, 0, 5)``, for tests whose broker
    behaviour differs between 3.x and 4.x."""
    version = str(broker_status["rabbitmq_version"])
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def _make_vhost(name: str, *, quorum: bool) -> None:
    arguments = ["add_vhost", name] + (["--default-queue-type", "quorum"] if quorum else [])
    rabbitmqctl(*arguments)
    rabbitmqctl("set_permissions", "-p", name, BROKER_USER, ".*", ".*", ".*")
    if quorum:
        rabbitmqctl(
            "set_policy", "-p", name, "delivery-limit", ".*",
            f'{{"delivery-limit": {QUEUE_DELIVERY_LIMIT}}}', "--apply-to", "queues",
        )  # fmt: skip


@pytest.fixture(scope="session")
def quorum_vhost(broker: None) -> Iterator[str]:
    """A vhost whose queues are quorum queues by default, with a delivery-limit policy."""
    name = f"atw-quorum-{uuid.uuid4().hex[:8]}"
    _make_vhost(name, quorum=True)
    yield name
    rabbitmqctl("delete_vhost", name)


@pytest.fixture(scope="session")
def classic_vhost(broker: None) -> Iterator[str]:
    """A vhost with RabbitMQ's default (classic) queue type."""
    name = f"atw-classic-{uuid.uuid4().hex[:8]}"
    _make_vhost(name, quorum=False)
    yield name
    rabbitmqctl("delete_vhost", name)


@dataclass
class Queues:
    """One test's broker coordinates."""

    vhost: str
    name: str = field(default_factory=lambda: f"t-{uuid.uuid4().hex[:10]}")

    @property
    def url(self) -> str:
        return broker_url(self.vhost)

    @property
    def in_queue(self) -> str:
        return f"{self.name}_in"

    @property
    def out_queue(self) -> str:
        return f"{self.name}_out"

    def counts(self, queue: str) -> tuple[int, int]:
        """``(ready, unacked)`` messages of ``queue``, as the broker reports them."""
        output = rabbitmqctl(
            "list_queues", "-q", "-p", self.vhost, "name", "messages_ready",
            "messages_unacknowledged",
        )  # fmt: skip
        for line in output.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == queue:
                return int(parts[1]), int(parts[2])
        raise LookupError(f"no queue {queue} in {self.vhost}")

    def assert_drained(self, queue: str, timeout_s: float = 20.0) -> None:
        """Wait until ``queue`` has nothing ready and nothing unacked."""
        self.assert_counts(queue, (0, 0), timeout_s)

    def assert_counts(self, queue: str, expected: tuple[int, int], timeout_s: float = 20.0) -> None:
        """Wait until ``queue`` holds ``(ready, unacked)`` messages.

        The broker publishes a quorum queue's counts with a lag (its stats interval), so a
        count read right after the last settle can still show the previous state.
        """
        deadline = time.monotonic() + timeout_s
        while (counts := self.counts(queue)) != expected:
            if time.monotonic() > deadline:
                raise AssertionError(f"{queue} holds {counts} (ready, unacked), not {expected}")
            time.sleep(0.5)

    def client(self, service: str) -> TaskClient:
        """A client of the worker ``service`` on these queues."""
        return TaskClient(
            url=self.url, service=service, in_queue=self.in_queue, out_queue=self.out_queue
        )

    def env(self, **overrides: str) -> dict[str, str]:
        """The environment of a worker process on these queues."""
        environment = dict(os.environ)
        environment.update(
            BROKER_URL=self.url,
            IN_QUEUE_NAME=self.in_queue,
            OUT_QUEUE_NAME=self.out_queue,
            WORKER_RETRY_BACKOFF_S="0.01",
            WORKER_RETRY_BACKOFF_MAX_S="0.01",
            # Every worker process its own free port: tests run several at once.
            HEALTH_CHECK_HOST="127.0.0.1",
            HEALTH_CHECK_PORT="0",
            PYTHONUNBUFFERED="1",
        )
        environment.update(overrides)
        return environment


@pytest.fixture
def queues(quorum_vhost: str) -> Queues:
    """Unique queue names in the quorum vhost."""
    return Queues(quorum_vhost)


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    """The folder handlers mark their calls in (``$ATW_TEST_MARKERS``)."""
    folder = tmp_path / "markers"
    folder.mkdir()
    return folder


class WorkerProcess:
    """``python -m async_task_api_worker run TARGET [ARGS]`` as a real process, stdout and
    stderr to files of their own."""

    def __init__(
        self, target: str, env: dict[str, str], logs: Path, args: tuple[str, ...] = ()
    ) -> None:
        self.target = target
        name = f"worker-{uuid.uuid4().hex[:6]}"
        self.stdout_path = logs / f"{name}.stdout"
        self.stderr_path = logs / f"{name}.stderr"
        self._stdout = self.stdout_path.open("w")
        self._stderr = self.stderr_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "async_task_api_worker", "run", target, *args],
            cwd=REPO,
            env=env,
            stdout=self._stdout,
            stderr=self._stderr,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        """Everything the process wrote: stdout, then stderr."""
        return self.stdout() + self.stderr_path.read_text()

    def stdout(self) -> str:
        return self.stdout_path.read_text()

    def lines(self) -> list[dict[str, Any]]:
        """The process's stdout lines, each parsed as JSON (fails on a line that is not)."""
        return [json.loads(line) for line in self.stdout().splitlines()]

    @property
    def probes_url(self) -> str:
        """``http://127.0.0.1:PORT`` of the probes server, read from its first log line."""
        self.wait_for_log("Probes server listening on ")
        match = re.search(r"Probes server listening on (http://[0-9.]+:[0-9]+)", self.log())
        assert match is not None
        return match.group(1)

    def wait_for_log(self, text: str, timeout_s: float = 30.0) -> None:
        """Wait until ``text`` appears in the process's output (or it exits, or time is up)."""

        def said() -> bool:
            if self.process.poll() is not None and text not in self.log():
                raise AssertionError(f"worker exited ({self.process.returncode}):\n{self.log()}")
            return text in self.log()

        wait_for(said, timeout_s, lambda: f"{text!r} in the log:\n{self.log()}")

    def wait(self, timeout_s: float = 30.0) -> int:
        return self.process.wait(timeout=timeout_s)

    def signal(self, number: signal.Signals) -> None:
        self.process.send_signal(number)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stdout.close()
        self._stderr.close()


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[object]:
    """Start worker processes; they are stopped (SIGTERM) after the test."""
    started: list[WorkerProcess] = []

    def start(
        target: str,
        env: dict[str, str],
        *,
        wait_connected: bool = True,
        args: tuple[str, ...] = (),
    ) -> WorkerProcess:
        worker = WorkerProcess(target, env, tmp_path, args)
        started.append(worker)
        if wait_connected:
            worker.wait_for_log("Connected to")
        return worker

    yield start
    for worker in started:
        worker.stop()
