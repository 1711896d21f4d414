"""The throughput benchmark still runs (a smoke run: tiny N; no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.conftest import REPO


def test_the_benchmark_drains_every_task(broker: None) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split("|") for line in done.stdout.splitlines() if line.startswith("| ")]
    assert [row[1].strip() for row in rows[1:]] == [
        "baseline: raw aio-pika loop, prefetch 1",
        "ours, async, concurrency 1",
    ]
    # Every task drained, every round trip answered, and a clean exit on SIGTERM.
    assert all(row[-2].strip() == "0" for row in rows[1:]), done.stdout
