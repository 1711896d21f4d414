"""The conformance kit against real workers: it passes correct ones and names each defect.

Every worker runs as a process in a vhost of its own (the acknowledgement case reads the
vhost's unacked deliveries), and the kit runs against it as a user runs it, through the
command line, with ``--junit-xml``. The runs are independent, so they run side by side, three
at a time (a module fixture), and each test reads its own run's verdicts:

- this SDK's reference worker (``examples/conformance_worker.py``), with the default settings,
  strict and with the opt-in ``cancel`` case: every case passes;
- the hand-rolled worker of ``tests/conformance/raw_worker.py`` (aio-pika and the protocol
  module, no engine, no cancels), strict: every case passes;
- the same worker with mutants (``BREAK``, several at once, one per case: ``mutants.GROUPS``),
  strict: exactly the cases of its mutants fail, each naming its mutant's problem. The mapping
  is docs/conformance.md's table "Each mutant against the case that fails it".
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

from tests.conformance.mutants import GROUPS, MUTANTS, group_of
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
#: The kit's options for a run beyond ``--strict`` (every run is strict: a skip fails it): the
#: reference worker claims cancels.
KIT_OPTIONS = {"reference": ["--with", "cancel"]}


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
            "--strict",
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
        verdicts, problems = _verdicts(junit) if junit.exists() else ({}, {})
        return Run(kit.returncode, verdicts, problems, text, subject.log)
    finally:
        if subject.worker.poll() is None:
            subject.worker.terminate()
        _end(subject)


#: Kits run at once: each runs a worker and calls ``rabbitmqctl`` (about a second a call, all
#: CPU); three at once, beside the rest of the suite, is the load the acceptance asks for.
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
        *((group_of(group[0]), raw, {**small, "BREAK": ",".join(group)}) for group in GROUPS),
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


@pytest.mark.parametrize("group", GROUPS, ids=[group_of(group[0]) for group in GROUPS])
def test_a_worker_with_mutants_fails_their_cases_and_no_other(
    runs: dict[str, Run], group: tuple[str, ...]
) -> None:
    run = runs[group_of(group[0])]
    assert run.code == 1, run.explain()
    assert set(run.verdicts) == ALL_CASES, run.explain()
    assert run.failed() == {MUTANTS[mode].case for mode in group}, run.explain()


@pytest.mark.parametrize("mode", list(MUTANTS))
def test_each_mutant_fails_its_case_with_a_line_that_names_it(
    runs: dict[str, Run], mode: str
) -> None:
    mutant = MUTANTS[mode]
    run = runs[group_of(mode)]
    assert run.verdicts.get(mutant.case) == "fail", run.explain()
    assert mutant.line in run.problems[mutant.case], run.explain()
