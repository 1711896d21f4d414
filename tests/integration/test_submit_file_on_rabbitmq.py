"""``submit --file``: many tasks, one report consumer, every report printed, none left behind."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.protocol import decode_report
from tests.integration.conftest import Queues
from tests.integration.test_cli_on_rabbitmq import cli

SUBMITTED = re.compile(r"^submitted task (\S+)$", flags=re.M)


def reports_by_task(stdout: str) -> dict[str, list[Any]]:
    """Each task's reports, in the order they were printed."""
    by_task: dict[str, list[Any]] = {}
    for line in stdout.splitlines():
        report = decode_report(line.encode())
        by_task.setdefault(report.task_id, []).append(report)
    return by_task


def test_submit_file_prints_every_report_of_ten_tasks_and_leaves_none_in_the_queue(
    queues: Queues, start_worker: Any, tmp_path: Path
) -> None:
    start_worker("examples.count_words:worker", queues.env())
    texts = [" ".join(["word"] * n) for n in range(1, 11)]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))

    done = cli(
        "submit", "--file", str(tasks), "--service", "count-words", "--timeout-s", "60",
        env=queues.env(),
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    submitted = SUBMITTED.findall(done.stderr)
    assert len(submitted) == 10
    by_task = reports_by_task(done.stdout)
    assert set(by_task) == set(submitted)
    for words, task_id in enumerate(submitted, start=1):
        assert [r.type for r in by_task[task_id]] == ["started", "progress", "success"]
        assert by_task[task_id][-1].response == {"words": words}
    queues.assert_drained(queues.out_queue)
    queues.assert_drained(queues.in_queue)


def test_submit_file_exits_1_when_a_task_fails_after_printing_every_report(
    queues: Queues, start_worker: Any, tmp_path: Path
) -> None:
    start_worker("examples.count_words:worker", queues.env())
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"text": "a b"}\n\n{"text": "   "}\n')  # the blank line is skipped

    done = cli(
        "submit", "--file", str(tasks), "--service", "count-words", "--timeout-s", "60",
        env=queues.env(),
    )  # fmt: skip

    assert done.returncode == 1, done.stderr
    first, second = SUBMITTED.findall(done.stderr)
    by_task = reports_by_task(done.stdout)
    assert [r.type for r in by_task[first]] == ["started", "progress", "success"]
    assert [r.type for r in by_task[second]] == ["started", "failure"]
    queues.assert_drained(queues.out_queue)


def test_submit_file_with_a_bad_line_publishes_nothing(queues: Queues, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"text": "a"}\n{"text": "b"}\n[1, 2]\n')

    done = cli("submit", "--file", str(tasks), "--service", "count-words", env=queues.env())

    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"async-task-api-worker: {tasks} line 3 must be a JSON object"
    ]
    with pytest.raises(LookupError):  # never declared: nothing connected
        queues.counts(queues.in_queue)


def test_submit_file_past_its_timeout_counts_the_tasks_without_a_terminal_report(
    queues: Queues, start_worker: Any, tmp_path: Path
) -> None:
    # Two tasks: one answers at once, one sleeps past the bound; both get started first.
    (tmp_path / "markers").mkdir()
    markers = str(tmp_path / "markers")
    env = queues.env(WORKER_CONCURRENCY="2", ATW_TEST_MARKERS=markers, WORKER_SHUTDOWN_GRACE_S="1")
    start_worker("tests.integration.workers:sleeping", env)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"seconds": 0}\n{"seconds": 600}\n')

    done = cli(
        "submit", "--file", str(tasks), "--service", "sleeping", "--timeout-s", "5",
        env=queues.env(),
    )  # fmt: skip

    assert done.returncode == 1
    by_task = reports_by_task(done.stdout)
    assert sorted([r.type for r in reports] for reports in by_task.values()) == [
        ["started"],
        ["started", "success"],
    ]
    assert "no terminal report within 5 s for 1 of 2 task(s)" in done.stderr


def test_submit_whose_reader_goes_away_stops_with_141_and_no_traceback(
    queues: Queues, start_worker: Any, tmp_path: Path
) -> None:
    import subprocess
    import sys

    from tests.closed_pipes import CLOSED_STDOUT
    from tests.integration.test_cli_on_rabbitmq import REPO

    start_worker("examples.count_words:worker", queues.env())
    tasks = tmp_path / "tasks.jsonl"
    # Enough tasks that reports still arrive after the reader went away: with a handful, a fast
    # worker could answer them all before the close, and submit would exit 0 having written all.
    tasks.write_text('{"text": "a b"}\n' * 500)
    arguments = ["submit", "--file", str(tasks), "--service", "count-words", "--timeout-s", "60"]
    with subprocess.Popen(
        [sys.executable, "-m", "async_task_api_worker", *arguments],
        cwd=REPO,
        env=queues.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as submit:
        assert submit.stdout is not None and submit.stderr is not None
        assert submit.stdout.readline()  # the first report, as `| head -n 1` reads it
        submit.stdout.close()
        assert submit.wait(timeout=60) == CLOSED_STDOUT  # as every command (cli.main)
        assert "Traceback" not in submit.stderr.read()
