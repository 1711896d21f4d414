"""The command line against the real broker: exit codes, one-line errors, submit, classic queues."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.protocol import FailureReport, decode_report
from tests.integration.conftest import REPO, Queues, broker_url
from tests.integration.test_run_on_rabbitmq import calls, collect


def cli(
    *arguments: str, env: dict[str, str], timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "async_task_api_worker", *arguments],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.mark.parametrize(
    ("target", "overrides", "expected"),
    [
        (
            "examples.count_words:worker",
            {"WORKER_DELIVERY_LIMIT": "0"},
            "invalid setting WORKER_DELIVERY_LIMIT:",
        ),
        (
            "examples.count_words:worker",
            {"WORKER_TASK_TIMEOUT_S": "5000"},
            "must be under WORKER_CONSUMER_TIMEOUT_S",
        ),
        ("tests.integration.broken_worker:worker", {}, "must be annotated exactly TaskContext"),
        ("examples.count_words:nothing", {}, "has no attribute 'nothing'"),
        ("no.such.module:worker", {}, "cannot import 'no.such.module'"),
        (
            "examples.count_words:worker",
            {"BROKER_URL": broker_url(password="wrong")},
            "refused the credentials",
        ),
        (
            "examples.count_words:worker",
            {"BROKER_URL": broker_url("no-such-vhost")},
            "access to vhost 'no-such-vhost' was refused",
        ),
    ],
    ids=["bad-setting", "budget", "definition", "attribute", "module", "credentials", "vhost"],
)
def test_configuration_errors_exit_2_with_one_line(
    queues: Queues,
    target: str,
    overrides: dict[str, str],
    expected: str,
    rabbitmq_version: tuple[int, ...],
) -> None:
    if "WORKER_TASK_TIMEOUT_S" in overrides and rabbitmq_version >= (4, 3):
        pytest.skip("4.3+ takes the worker's own consumer timeout: the budget rule is not needed")
    done = cli("run", target, env=queues.env(**overrides))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert expected in lines[0]
    assert "wrong" not in lines[0]  # the password never shows


def test_submit_prints_each_report_and_exits_0_on_success(
    queues: Queues, start_worker: Any
) -> None:
    start_worker("examples.count_words:worker", queues.env())
    done = cli(
        "submit", '{"text": "a b c d"}', "--service", "count-words", "--timeout-s", "30",
        env=queues.env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    reports = [decode_report(line.encode()) for line in done.stdout.splitlines()]
    assert [r.type for r in reports] == ["started", "progress", "success"]
    assert reports[-1].response == {"words": 4}  # type: ignore[union-attr]


def test_submit_exits_1_on_a_failure(queues: Queues, start_worker: Any) -> None:
    start_worker("examples.count_words:worker", queues.env())
    done = cli(
        "submit", '{"text": " "}', "--service", "count-words", "--timeout-s", "30",
        env=queues.env(),
    )  # fmt: skip
    assert done.returncode == 1
    assert [decode_report(line.encode()).type for line in done.stdout.splitlines()] == [
        "started",
        "failure",
    ]


@pytest.mark.parametrize("bad_input", ["[1, 2]", "{not json"])
def test_submit_refuses_an_input_that_is_not_an_object(queues: Queues, bad_input: str) -> None:
    done = cli("submit", bad_input, "--service", "count-words", env=queues.env())
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1


def test_submit_gives_up_after_its_timeout(queues: Queues) -> None:
    done = cli("submit", "{}", "--service", "nobody-home", "--timeout-s", "0.5", env=queues.env())
    assert done.returncode == 1
    assert "no terminal report within 0.5 s" in done.stderr


async def test_a_classic_queue_retries_once_then_concludes_with_a_warning(
    classic_vhost: str, start_worker: Any, markers: Path
) -> None:
    queues = Queues(classic_vhost)
    worker = start_worker(
        "tests.integration.workers:retrying", queues.env(ATW_TEST_MARKERS=str(markers))
    )
    assert "is not a quorum queue" in worker.log()
    async with queues.client("retrying") as client:
        task_id = await client.submit({})
        reports = await collect(client, task_id)
    assert calls(markers, task_id) == [1, 2]
    assert isinstance(reports[-1], FailureReport)
    assert (reports[-1].error.code, reports[-1].attempt) == ("UPSTREAM_DOWN", 2)
    # The decision line follows the settle, which follows the report the client already has.
    worker.wait_for_log("outcome=failure action=conclude code=UPSTREAM_DOWN attempt=2/2")
    assert "outcome=retry action=nack-requeue code=UPSTREAM_DOWN attempt=1/2" in worker.log()
    queues.assert_drained(queues.in_queue)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--task-id", "has space"], "task_id"),
        (["--input-ref", '{"name": "v"}'], "input_refs.0.uri: missing"),
        (["--timeout-s", "0"], "--timeout-s must be a positive number"),
    ],
)
def test_submit_refuses_a_task_the_worker_would_refuse_before_publishing(
    queues: Queues, arguments: list[str], message: str
) -> None:
    done = cli("submit", "{}", "--service", "count-words", *arguments, env=queues.env())
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
