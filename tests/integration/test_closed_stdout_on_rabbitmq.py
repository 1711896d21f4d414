"""``reports`` and ``run`` stop quietly when their reader is gone (``submit``: its own file).

The pipe's read end is closed before the command starts, so its first report line fails with
EPIPE every time: exit 141 (128 + SIGPIPE, ``cli.main``), nothing on stderr but the command's
own lines; ``reports`` leaves the reports it could not print in the output queue.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.closed_pipes import CLOSED_STDOUT, with_closed_stdout
from tests.integration.conftest import REPO, Queues


async def test_reports_stops_quietly_and_leaves_the_reports_queued(
    queues: Queues, start_worker: Any
) -> None:
    worker = start_worker("examples.count_words:worker", queues.env())
    client = queues.client("count-words")
    await client.connect(reports=False)  # the reports stay in the output queue
    try:
        task_id = await client.submit({"text": "a b c"})
    finally:
        await client.close()
    worker.wait_for_log("Delivery settled")  # its reports are confirmed in the queue by now

    read = with_closed_stdout("reports", "--service", "count-words", env=queues.env())
    assert read.returncode == CLOSED_STDOUT, read.stderr
    assert "Traceback" not in read.stderr
    assert "0 report(s) printed" in read.stderr  # each is acked only once written

    left = subprocess.run(
        [sys.executable, "-m", "async_task_api_worker", "reports", "--service", "count-words"],
        cwd=REPO,
        env=queues.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert left.returncode == 0, left.stderr
    reports = [json.loads(line) for line in left.stdout.splitlines()]
    assert [(r["task_id"], r["type"]) for r in reports] == [
        (task_id, "started"),
        (task_id, "progress"),
        (task_id, "success"),
    ]


def test_run_drains_and_exits_when_its_log_reader_is_gone(queues: Queues) -> None:
    # ``run ... | head``: it logs to stdout; with nobody reading, it stops as on SIGTERM.
    ran = with_closed_stdout(
        "run", "examples.count_words:worker", "--health-port", "0", env=queues.env()
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stderr.splitlines()
    assert len(lines) == 1, ran.stderr  # said once, then nothing more is written anywhere
    assert "The log stream's reader is gone" in lines[0]
