"""One outcome per correlation id: ``<id>.done`` records the one sent; a later one is dropped."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.conclusion import Response
from async_task_api_worker.detached import Marker, spawn_detached, sweep
from async_task_api_worker.detached.claims import process_start_time
from async_task_api_worker.detached.run import finish
from async_task_api_worker.detached.state import DONE_RETENTION_S, read_json, write_atomically
from async_task_api_worker.detached.sweep import prune_done
from tests.unit.detached.support import (
    HANDLERS,
    Inbox,
    fixed_clocks,
    marker_of,
    stop_worker,
    wait_until,
)

LATER = "a later outcome for an already reported task"


def later_outcome_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and LATER in record.getMessage()
    ]


def test_a_worker_finishing_after_its_expiry_is_not_reported_twice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="async_task_api_worker.detached")
    state = tmp_path / "state"
    gate = tmp_path / "gate"
    spawn_detached(state, "o-1", {"gate": str(gate)}, handler=f"{HANDLERS}:gated", deadline_s=60)
    wait_until(lambda: marker_of(state, "o-1").get("pid") is not None)
    marker = Marker.from_json(marker_of(state, "o-1"))
    assert marker.start_time is not None and marker.started_boot_s is not None
    try:
        # The sweep must take the worker for dead (so as not to kill it): another start time.
        document = marker_of(state, "o-1")
        document["start_time"] = marker.start_time - 1
        write_atomically(state / "o-1.running", json.dumps(document).encode())
        inbox = Inbox()

        def send_while_the_worker_finishes(correlation_id: str, result: dict[str, Any]) -> None:
            # The worker ends between the sweep's claim and its record of the send: it finds
            # no marker and no record, so it writes its result.
            inbox(correlation_id, result)
            gate.touch()
            wait_until((state / "o-1.json").exists)

        late = fixed_clocks(marker.started_boot_s + 61, 1.7e9, marker.boot_id)
        report = sweep(state, send_while_the_worker_finishes, clocks=late)
        assert report.expired == ["o-1"]
        wait_until(lambda: process_start_time(marker.pid or 0) is None)
        report = sweep(state, inbox, clocks=late)
        assert report.delivered == [] and report.dropped == ["o-1"]
        ((_, result),) = inbox.sent
        assert result["error"]["code"] == "WORKER_DIED"
        (warning,) = later_outcome_warnings(caplog)
        assert "o-1" in warning
        assert sorted(path.name for path in state.iterdir()) == ["o-1.done"]
    finally:
        stop_worker(marker.pid, marker.start_time)


def test_a_result_for_a_reported_task_is_dropped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="async_task_api_worker.detached")
    state = tmp_path / "state"
    state.mkdir()
    (state / "o-2.done").touch()
    write_atomically(state / "o-2.json", json.dumps({"ok": True, "response": {}}).encode())
    inbox = Inbox()
    report = sweep(state, inbox)
    assert inbox.sent == [] and report.dropped == ["o-2"]
    assert len(later_outcome_warnings(caplog)) == 1
    assert not (state / "o-2.json").exists()


def test_a_worker_writes_its_result_without_its_marker_but_not_once_its_task_was_reported(
    tmp_path: Path,
) -> None:
    marker = Marker.new("o-3", 60, {"k": 1})
    finish(tmp_path, "o-3", marker, Response({"n": 1}))  # no marker file
    assert read_json(tmp_path / "o-3.json") == {
        "ok": True,
        "response": {"n": 1},
        "correlation_id": "o-3",
        "meta": {"k": 1},
    }
    write_atomically(tmp_path / "o-4.running", Marker.new("o-4", 60, {}).to_json())
    (tmp_path / "o-4.done").touch()
    finish(tmp_path, "o-4", Marker.new("o-4", 60, {}), Response({}))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["o-3.json", "o-4.done"]


def test_a_sweep_records_each_send_and_prunes_old_records(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    write_atomically(state / "o-5.json", json.dumps({"ok": True, "response": {}}).encode())
    write_atomically(state / "o-6.running", Marker.new("o-6", -1, {}).to_json())
    sweep(state, Inbox())
    assert sorted(path.name for path in state.glob("*.done")) == ["o-5.done", "o-6.done"]
    old = state / "o-5.done"
    os.utime(old, (old.stat().st_mtime - DONE_RETENTION_S - 1,) * 2)
    assert prune_done(state) == ["o-5"]
    later = fixed_clocks(0.0, (state / "o-6.done").stat().st_mtime + DONE_RETENTION_S + 1)
    sweep(state, Inbox(), clocks=later)
    assert list(state.glob("*.done")) == []


def test_new_work_under_a_reported_id_is_reported_again(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "o-7.done").touch()  # the outcome of earlier work under this id went out
    spawn_detached(state, "o-7", {"seconds": 0}, handler=f"{HANDLERS}:slow", deadline_s=30)
    inbox = Inbox()

    def swept() -> bool:  # the sweep sends a result once the worker's file is there
        sweep(state, inbox)
        return bool(inbox.sent)

    wait_until(swept)
    assert [correlation_id for correlation_id, _ in inbox.sent] == ["o-7"]
