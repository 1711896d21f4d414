"""docs/getting-started.md's RabbitMQ blocks, as written: ``run`` the reader's worker, ``submit``
a task, ``submit`` a slow one and ``cancel`` it (the page's other blocks:
tests/docs/test_getting_started_page.py).

The commands run in a project folder holding the page's files, in a vhost of the test's own
(``BROKER_URL``; the page's queue names, the service's own), the probes on a free port.
"""

from __future__ import annotations

import contextlib
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
    """A quorum vhost of the test's own, deleted after it (its processes stopped first)."""
    name = f"atw-getting-started-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", name, "--default-queue-type", "quorum")
    rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    yield name
    with contextlib.suppress(RuntimeError):
        rabbitmqctl("delete_vhost", name)


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


def test_run_submit_and_cancel_print_what_the_page_shows(reader: Shell) -> None:
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
