"""Running the conformance kit as a user runs it, against a worker process in a vhost of its own.

:func:`start_subject` starts a worker in a new quorum vhost of the tests' broker; :func:`run_kit`
runs ``async-task-api-worker conformance --strict`` against it through the command line, with
``--junit-xml``, and reads each case's verdict back (:class:`Run`). Used by
tests/integration/test_conformance_reference.py (every broker version of CI) and
tests/conformance/ (the hand-rolled worker and its mutants).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from tests.integration.conftest import BROKER_USER, RABBITMQCTL, REPO, broker_url, rabbitmqctl

__all__ = ["ALL_CASES", "Run", "Subject", "run_kit", "start_subject"]

#: The battery's cases that run by default.
ALL_CASES = frozenset(
    {"round_trip", "decoding", "encoding", "order", "retries", "acknowledgement", "limits"}
)


@dataclass
class Run:
    """One kit run: its exit code, the verdict of each case, and the kit's and worker's output.

    ``problems``: the failure text of each failed case (its lines, one a problem).
    """

    code: int
    verdicts: dict[str, str]
    problems: dict[str, str]
    output: str
    worker_log: Path

    def failed(self) -> set[str]:
        return {case for case, verdict in self.verdicts.items() if verdict == "fail"}

    def explain(self) -> str:
        return f"{self.output}\n--- worker ---\n{self.worker_log.read_text()[-3000:]}"


def _verdicts(junit: Path) -> tuple[dict[str, str], dict[str, str]]:
    verdicts, problems = {}, {}
    for case in ET.parse(junit).getroot().iter("testcase"):  # noqa: S314 - our own file
        failure = case.find("failure")
        if failure is not None:
            verdicts[str(case.get("name"))] = "fail"
            problems[str(case.get("name"))] = failure.text or ""
        elif case.find("skipped") is not None:
            verdicts[str(case.get("name"))] = "skip"
        else:
            verdicts[str(case.get("name"))] = "pass"
    return verdicts, problems


@dataclass
class Subject:
    name: str
    vhost: str
    env: dict[str, str]
    log: Path
    worker: subprocess.Popen[bytes]


def start_subject(name: str, command: list[str], overrides: dict[str, str], logs: Path) -> Subject:
    vhost = f"atw-conformance-{name}-{uuid.uuid4().hex[:6]}"
    rabbitmqctl("add_vhost", vhost, "--default-queue-type", "quorum")
    rabbitmqctl("set_permissions", "-p", vhost, BROKER_USER, ".*", ".*", ".*")
    env = dict(os.environ)
    env.update(
        BROKER_URL=broker_url(vhost),
        HEALTH_CHECK_HOST="127.0.0.1",
        HEALTH_CHECK_PORT="0",
        WORKER_RETRY_BACKOFF_S="0.05",
        PYTHONUNBUFFERED="1",
    )
    env.update(overrides)
    log = logs / f"{name}.log"
    with log.open("wb") as sink:
        worker = subprocess.Popen(command, cwd=REPO, env=env, stdout=sink, stderr=sink)
    return Subject(name, vhost, env, log, worker)


def _end(subject: Subject) -> None:
    try:
        subject.worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        subject.worker.kill()
    rabbitmqctl("delete_vhost", subject.vhost)


def run_kit(subject: Subject, logs: Path, options: list[str]) -> Run:
    """Run the kit, strict, against ``subject``'s worker, with ``options`` besides; then stop the
    worker and delete its vhost."""
    try:
        junit = logs / f"{subject.name}.xml"
        command = [
            sys.executable,
            "-m",
            "async_task_api_worker",
            "conformance",
            "--service",
            "conformance",
            "--junit-xml",
            str(junit),
            "--rabbitmqctl",
            " ".join(RABBITMQCTL),
            "--strict",
            *options,
        ]
        # The kit waits (up to its --timeout-s) for its worker to consume.
        kit = subprocess.run(
            command,
            cwd=REPO,
            env=subject.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=180,
            check=False,
        )
        text = kit.stdout.decode(errors="replace")
        verdicts, problems = _verdicts(junit) if junit.exists() else ({}, {})
        return Run(kit.returncode, verdicts, problems, text, subject.log)
    finally:
        if subject.worker.poll() is None:
            subject.worker.terminate()
        _end(subject)
