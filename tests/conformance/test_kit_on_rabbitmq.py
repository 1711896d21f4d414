"""The conformance kit against real workers: it passes correct ones and names each defect.

Every worker runs as a process in a vhost of its own (the acknowledgement case reads the
vhost's unacked deliveries), and the kit runs against it as a user runs it, through the
command line, with ``--junit-xml``. The runs are independent, so they run side by side, three
at a time (a module fixture), and each test reads its own run's verdicts:

- this SDK's reference worker (``examples/conformance_worker.py``), with the default settings,
  strict and with the opt-in ``cancel`` case: every case passes;
- the hand-rolled worker of ``tests/conformance/raw_worker.py`` (aio-pika and the protocol
  module, no engine, no cancels), strict: every case passes;
- the same worker with one rule broken (``BREAK``): exactly the case of that rule fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.conftest import (
    BROKER_USER,
    RABBITMQCTL,
    REPO,
    broker,
    broker_status,
    broker_url,
    rabbitmqctl,
)

# The broker fixtures of the integration tests, used here by name.
__all__ = ["broker", "broker_status"]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: Each broken worker, and the one case its defect must fail.
BROKEN = {
    "ack_early": "acknowledgement",
    "unsorted_keys": "encoding",
    "progress_after_terminal": "order",
    "local_attempts": "retries",
    "poison_requeued": "decoding",
    "depth_unchecked": "limits",
}
ALL_CASES = {
    "round_trip",
    "decoding",
    "encoding",
    "order",
    "retries",
    "acknowledgement",
    "limits",
}
REFERENCE = "examples.conformance_worker:worker"
#: The kit's options for a run beyond the defaults: strict (a skip fails) for the correct
#: workers, and the reference worker claims cancels.
KIT_OPTIONS = {"reference": ["--strict", "--with", "cancel"], "raw": ["--strict"]}


@dataclass
class Run:
    """One kit run: its exit code, the verdict of each case, and the kit's and worker's output."""

    code: int
    verdicts: dict[str, str]
    output: str
    worker_log: Path

    def failed(self) -> set[str]:
        return {case for case, verdict in self.verdicts.items() if verdict == "fail"}

    def explain(self) -> str:
        return f"{self.output}\n--- worker ---\n{self.worker_log.read_text()[-3000:]}"


def _verdicts(junit: Path) -> dict[str, str]:
    verdicts = {}
    for case in ET.parse(junit).getroot().iter("testcase"):  # noqa: S314 - our own file
        if case.find("failure") is not None:
            verdicts[str(case.get("name"))] = "fail"
        elif case.find("skipped") is not None:
            verdicts[str(case.get("name"))] = "skip"
        else:
            verdicts[str(case.get("name"))] = "pass"
    return verdicts


@dataclass
class _Subject:
    name: str
    vhost: str
    env: dict[str, str]
    log: Path
    worker: subprocess.Popen[bytes]


def _start(name: str, command: list[str], overrides: dict[str, str], logs: Path) -> _Subject:
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
    return _Subject(name, vhost, env, log, worker)


def _end(subject: _Subject) -> None:
    try:
        subject.worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        subject.worker.kill()
    rabbitmqctl("delete_vhost", subject.vhost)


def _kit(subject: _Subject, logs: Path) -> Run:
    """Run the kit against ``subject``'s worker, then stop the worker and delete its vhost."""
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
            *KIT_OPTIONS.get(subject.name, []),
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
        verdicts = _verdicts(junit) if junit.exists() else {}
        return Run(kit.returncode, verdicts, text, subject.log)
    finally:
        if subject.worker.poll() is None:
            subject.worker.terminate()
        _end(subject)


#: Kits run at once. The acknowledgement case times a ``rabbitmqctl`` policy against its task
#: (about a second a call, all CPU): eight at once on two cores, beside the rest of the suite,
#: made it come too late.
KITS_AT_ONCE = 3


@pytest.fixture(scope="module")
def runs(broker: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Every worker of this module, and the kit run against each, ``KITS_AT_ONCE`` at a time."""
    logs = tmp_path_factory.mktemp("conformance")
    small = {"WORKER_MAX_MESSAGE_BYTES": str(1024 * 1024)}
    raw = [sys.executable, "-m", "tests.conformance.raw_worker"]
    starts = [
        (
            "reference",
            [sys.executable, "-m", "async_task_api_worker", "run", REFERENCE],
            {},
        ),
        ("raw", raw, small),
        *((mode, raw, {**small, "BREAK": mode}) for mode in BROKEN),
    ]

    def one(start: tuple[str, list[str], dict[str, str]]) -> tuple[str, Run]:
        subject = _start(*start, logs)
        return subject.name, _kit(subject, logs)

    with ThreadPoolExecutor(KITS_AT_ONCE) as pool:
        return dict(pool.map(one, starts))


def test_this_sdks_reference_worker_passes_every_case_strict_and_with_cancel(
    runs: dict[str, Run],
) -> None:
    run = runs["reference"]
    assert run.code == 0, run.explain()
    assert run.verdicts == dict.fromkeys(ALL_CASES | {"cancel"}, "pass"), run.explain()


def test_a_hand_rolled_worker_that_keeps_every_rule_passes_every_case_strict(
    runs: dict[str, Run],
) -> None:
    run = runs["raw"]
    assert run.code == 0, run.explain()
    assert run.verdicts == dict.fromkeys(ALL_CASES, "pass"), run.explain()


@pytest.mark.parametrize(("mode", "case"), list(BROKEN.items()))
def test_a_worker_that_breaks_one_rule_fails_that_case_alone(
    runs: dict[str, Run], mode: str, case: str
) -> None:
    run = runs[mode]
    assert run.code == 1, run.explain()
    assert run.failed() == {case}, run.explain()
    assert set(run.verdicts) == ALL_CASES, run.explain()
