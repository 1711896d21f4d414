"""Unreadable state files: an ERROR line, the metric, and an outcome for the task they name."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.detached import Marker, in_flight, spawn_detached, sweep
from async_task_api_worker.detached.state import write_atomically
from tests.unit.detached.support import (
    HANDLERS,
    Inbox,
    fixed_clocks,
    marker_of,
    stop_worker,
    unreadable_count,
    wait_until,
)

CONTEXT = {"task_id": "u-2", "client_id": "client-1", "attempt": 2, "delivery_limit": 5}


def write_input(state: Path, correlation_id: str) -> None:
    """``<id>.input`` as the ``tick`` command writes it."""
    context = {**CONTEXT, "task_id": correlation_id, "service": "svc", "input_refs": []}
    write_atomically(
        state / f"{correlation_id}.input", json.dumps({"input": {}, "context": context}).encode()
    )


def error_lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.ERROR and text in record.getMessage()
    ]


def spawn_running(state: Path, correlation_id: str, gate: Path, meta: dict[str, Any]) -> Marker:
    """A worker whose handler runs (it waits for ``gate``); its marker with its pid."""
    running = state.parent / f"{correlation_id}.handler-running"
    spawn_detached(
        state,
        correlation_id,
        {"gate": str(gate), "running": str(running)},
        handler=f"{HANDLERS}:gated",
        deadline_s=60,
        meta=meta,
    )
    wait_until(running.exists)
    return Marker.from_json(marker_of(state, correlation_id))


def test_a_marker_made_unreadable_while_its_worker_runs_still_gets_its_result_delivered(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    gate = tmp_path / "gate"
    marker = spawn_running(state, "u-1", gate, {"k": 1})
    try:
        (state / "u-1.running").write_bytes(b'{"correlation_id": "u-1", "dead')  # torn
        inbox = Inbox()
        report = sweep(state, inbox, fallback_deadline_s=60)
        assert report.moved_aside == ["u-1.running"] and inbox.sent == []
        assert in_flight(state)  # a readable marker in its place
        gate.touch()
        wait_until((state / "u-1.json").exists)
        assert sweep(state, inbox, fallback_deadline_s=60).delivered == ["u-1"]
        ((correlation_id, result),) = inbox.sent
        assert correlation_id == "u-1" and result["ok"] is True
        assert result["response"] == {"gated": True}
        assert result["meta"] == {"k": 1}  # the worker's own, read at its start
        assert sweep(state, inbox, fallback_deadline_s=60).delivered == []
        assert len(inbox.sent) == 1 and not in_flight(state)
    finally:
        stop_worker(marker.pid, marker.start_time)


def test_a_worker_whose_marker_is_gone_still_leaves_its_result(tmp_path: Path) -> None:
    state = tmp_path / "state"
    gate = tmp_path / "gate"
    marker = spawn_running(state, "u-3", gate, {})
    try:
        (state / "u-3.running").unlink()  # moved aside by hand, say
        gate.touch()
        wait_until((state / "u-3.json").exists)
        inbox = Inbox()
        assert sweep(state, inbox).delivered == ["u-3"]
        assert inbox.sent[0][1]["response"] == {"gated": True}
    finally:
        stop_worker(marker.pid, marker.start_time)


def test_a_marker_made_unreadable_with_no_worker_is_reported_as_a_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    write_input(state, "u-2")
    (state / "u-2.running").write_bytes(b"\x00\xff garbage")
    before = unreadable_count("marker")
    inbox = Inbox()
    report = sweep(state, inbox)  # no fallback deadline: reported at once
    assert report.moved_aside == ["u-2.running"] and report.expired == ["u-2"]
    ((correlation_id, result),) = inbox.sent
    assert correlation_id == "u-2" and result["ok"] is False
    assert result["error"]["code"] == "WORKER_DIED"
    assert "could not be read" in result["error"]["message"]
    assert result["meta"] == CONTEXT  # what the task's report needs, from its input
    assert len(error_lines(caplog, "Unreadable marker u-2.running")) == 1
    assert unreadable_count("marker") == before + 1
    assert sweep(state, inbox).expired == [] and len(inbox.sent) == 1
    assert not in_flight(state) and len(list((state / "bad").iterdir())) == 1


def test_an_unreadable_marker_is_reported_at_the_fallback_deadline_after_its_last_write(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    boot, wall = 5000.0, 1.7e9
    (state / "u-4.running").write_text("{}")  # no field of a marker
    os.utime(state / "u-4.running", (wall - 10, wall - 10))
    inbox = Inbox()
    report = sweep(state, inbox, fallback_deadline_s=30, clocks=fixed_clocks(boot, wall))
    assert report.expired == [] and inbox.sent == []
    replacement = marker_of(state, "u-4")
    assert replacement["started_boot_s"] == boot - 10 and replacement["deadline_s"] == 30
    assert replacement["pid"] is None and replacement["meta"] == {}  # no input to recover from
    stepped_back = wall - 3600  # the boot clock decides, not the wall clock
    assert sweep(state, inbox, clocks=fixed_clocks(boot + 19, stepped_back)).expired == []
    assert sweep(state, inbox, clocks=fixed_clocks(boot + 20, stepped_back)).expired == ["u-4"]
    ((_, result),) = inbox.sent
    assert result["error"]["code"] == "WORKER_DIED" and result["meta"] == {}


def test_an_unreadable_result_is_reported_as_a_failure_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    write_input(state, "u-5")
    (state / "u-5.json").write_bytes(b'{"ok": tr')
    before = unreadable_count("result")
    inbox = Inbox()
    report = sweep(state, inbox)
    assert report.moved_aside == ["u-5.json"] and report.delivered == ["u-5"]
    ((correlation_id, result),) = inbox.sent
    assert correlation_id == "u-5" and result["error"]["code"] == "WORKER_DIED"
    assert result["meta"] == {**CONTEXT, "task_id": "u-5"}
    assert len(error_lines(caplog, "Unreadable result u-5.json")) == 1
    assert unreadable_count("result") == before + 1
    assert sweep(state, inbox).delivered == [] and len(inbox.sent) == 1


def test_the_failure_of_an_unreadable_result_is_sent_by_a_later_sweep_if_its_send_fails(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "u-6.json").write_bytes(b"garbage")

    def down(correlation_id: str, result: dict[str, Any]) -> None:
        raise ConnectionError("the broker is down")

    with pytest.raises(ConnectionError):
        sweep(state, down)
    inbox = Inbox()
    sweep(state, inbox)
    assert inbox.ids() == ["u-6"] and inbox.sent[0][1]["error"]["code"] == "WORKER_DIED"


def test_unreadable_files_of_an_already_reported_task_send_nothing_more(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "u-7.done").touch()
    (state / "u-7.json").write_bytes(b"garbage")
    (state / "u-7.running").write_bytes(b"garbage")
    markers, results = unreadable_count("marker"), unreadable_count("result")
    inbox = Inbox()
    report = sweep(state, inbox)
    assert inbox.sent == [] and sorted(report.moved_aside) == ["u-7.json", "u-7.running"]
    assert len(error_lines(caplog, "Unreadable")) == 2
    assert (unreadable_count("marker"), unreadable_count("result")) == (markers + 1, results + 1)
    assert not in_flight(state)


def test_an_unreadable_file_that_names_no_task_is_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "no task here!.running").write_bytes(b"garbage")
    before = unreadable_count("marker")
    inbox = Inbox()
    assert sweep(state, inbox).moved_aside == ["no task here!.running"]
    assert inbox.sent == [] and not in_flight(state)
    assert len(error_lines(caplog, "names no task")) == 1
    assert unreadable_count("marker") == before + 1
