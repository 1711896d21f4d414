"""The throughput benchmark still runs (a smoke run: tiny N; no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.conftest import REPO


def test_the_benchmark_drains_every_task(broker: None) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.throughput", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if not line.startswith(("#", "contender"))]
    assert [row.split("  ")[0] for row in rows] == [
        "baseline (raw aio-pika)",
        "ours, async, concurrency 1",
    ]
