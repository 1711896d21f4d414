"""docs/getting-started.md's RabbitMQ blocks, as written: ``run`` the reader's worker, ``submit``
a task, ``submit`` a slow one and ``cancel`` it (the page's other blocks:
tests/docs/test_getting_started_page.py).

The commands run in a project folder holding the page's files, in a quorum vhost of the test's
own that the page's ``vhost`` block makes (``BROKER_URL``; the page's queue names, the
service's own), the probes on a free port.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.blocks import normalised, run_block, write_files
from tests.docs.test_getting_started_page import shell, shell_env
from tests.integration.conftest import Queues, rabbitmqctl
from tests.polling import wait_for

PAGE = "getting-started.md"


@pytest.fixture
def vhost(broker: None) -> Iterator[str]:
    """The name of a vhost of the test's own, which the page's ``vhost`` block makes (its
    ``work``); deleted after the test (its processes stopped first)."""
    name = f"atw-getting-started-{uuid.uuid4().hex[:8]}"
    yield name
    with contextlib.suppress(RuntimeError):
        rabbitmqctl("delete_vhost", name)


def make_the_vhost(vhost: str) -> None:
    """The page's ``vhost`` block, its vhost ``work`` named ``vhost``: the ``rabbitmqctl`` lines
    run through the tests' rabbitmqctl (``ATW_RABBITMQCTL``); the ``export`` names that vhost on
    the default broker (the test's ``BROKER_URL`` is the same vhost on the tests' broker)."""
    steps = run_block(PAGE, "vhost").steps()
    assert [command.split()[0] for command, _ in steps] == ["rabbitmqctl", "rabbitmqctl", "export"]
    for command, shown in steps[:2]:
        assert not shown
        rabbitmqctl(*[vhost if word == "work" else word for word in shlex.split(command)[1:]])
    assert steps[2][0] == "export BROKER_URL=amqp://guest:guest@localhost:5672/work"


class Shell:
    """Commands of the page in the reader's project folder, in the test's vhost; the ones left
    running are stopped (SIGTERM) at the end."""

    def __init__(self, folder: Path, vhost: str) -> None:
        self.folder = folder
        self.env = shell_env()
        broker = Queues(vhost).env()
        for name in ("BROKER_URL", "HEALTH_CHECK_HOST", "HEALTH_CHECK_PORT", "PYTHONUNBUFFERED"):
            self.env[name] = broker[name]
        self.started: list[tuple[subprocess.Popen[str], Path]] = []

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        return shell(command, self.folder, env=self.env)

    def start(self, command: str) -> tuple[subprocess.Popen[str], Path]:
        out = self.folder / f"out-{len(self.started)}.log"
        with out.open("w") as stdout:
            process = subprocess.Popen(
                ["bash", "-c", f"exec {command}"], cwd=self.folder, env=self.env,
                stdout=stdout, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
        self.started.append((process, out))
        return process, out

    def stop(self) -> None:
        for process, _ in self.started:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=60)


@pytest.fixture
def reader(tmp_path: Path, vhost: str) -> Iterator[Shell]:
    write_files(PAGE, tmp_path)
    terminal = Shell(tmp_path, vhost)
    yield terminal
    terminal.stop()


def wait_for_output(process: subprocess.Popen[str], out: Path, text: str) -> None:
    def said() -> bool:
        if process.poll() is not None and text not in out.read_text():
            raise AssertionError(f"exited ({process.returncode}):\n{out.read_text()}")
        return text in out.read_text()

    wait_for(said, 60, lambda: f"{text!r} in:\n{out.read_text()}")


def test_run_submit_and_cancel_print_what_the_page_shows(reader: Shell, vhost: str) -> None:
    make_the_vhost(vhost)
    ((run_command, _),) = run_block(PAGE, "worker").steps()
    worker, worker_log = reader.start(run_command)
    wait_for_output(worker, worker_log, "Connected to")

    ((submit_command, shown),) = run_block(PAGE, "submit").steps()
    done = reader.run(submit_command)
    assert done.returncode == 0, done.stderr
    assert normalised(done.stdout.splitlines()) == normalised(shown)
    assert done.stderr.startswith("submitted task ")

    ((slow_command, slow_shown),) = run_block(PAGE, "slow-submit").steps()
    slow, slow_out = reader.start(slow_command)
    wait_for_output(slow, slow_out, '"type":"started"')
    ((cancel_command, cancel_shown),) = run_block(PAGE, "cancel").steps()
    cancelled = reader.run(cancel_command)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.splitlines() == cancel_shown

    assert slow.wait(timeout=60) == 1  # a failure: TASK_CANCELLED
    printed = [line for line in slow_out.read_text().splitlines() if line.startswith("{")]
    # A progress report may come first if the cancel took a second or more (the page says so).
    assert normalised([line for line in printed if '"progress"' not in line]) == normalised(
        slow_shown
    )
