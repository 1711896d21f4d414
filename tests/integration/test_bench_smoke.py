"""The benchmark still runs (a smoke run: tiny N; no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import REPO


def _bench(*arguments: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "bench", *arguments],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


# The bench's own guard (120 s) is the hang guard, not pytest's default: two workers drain
# 50 tasks each, minutes on a loaded 2-core machine.
@pytest.mark.timeout(180)
def test_the_benchmark_drains_every_task(broker: None, tmp_path: Path) -> None:
    done = _bench("--smoke", "--out", str(tmp_path))
    rows = [line.split("|") for line in done.stdout.splitlines() if line.startswith("| ")]
    assert [row[1].strip() for row in rows[1:]] == [
        "baseline: raw aio-pika loop, prefetch 1",
        "ours, async, concurrency 1",
    ]
    # The drain waits for all 50 terminal reports (it fails the run otherwise); every round
    # trip got its answer, and each worker exited 0 on SIGTERM.
    raw = json.loads((tmp_path / "results.json").read_text())
    assert [row["key"] for row in raw["rows"]] == ["baseline", "ours-c1"]
    for row in raw["rows"]:
        [run] = row["runs"]
        assert len(run["round_trips_s"]) == 5
        assert run["exit_code"] == 0
    # The results file is rebuilt from the raw figures alone.
    (tmp_path / "results.md").unlink()
    _bench("--replot", str(tmp_path / "results.json"))
    assert "ours, async, concurrency 1" in (tmp_path / "results.md").read_text()
