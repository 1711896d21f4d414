"""Deadlines on the boot clock: a wall-clock step neither shortens nor lengthens a task's time."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from async_task_api_worker.detached import Marker, in_flight, spawn_detached, sweep
from async_task_api_worker.detached.claims import process_start_time
from async_task_api_worker.detached.run import watch_deadline
from async_task_api_worker.detached.state import Clocks, read_json, write_atomically
from tests.unit.detached.support import (
    HANDLERS,
    Inbox,
    fixed_clocks,
    marker_of,
    stop_worker,
    wait_until,
)


def spawn_gated(state: Path, correlation_id: str, deadline_s: float) -> Marker:
    """A live worker that waits for a gate nobody opens; its marker once it wrote its pid."""
    spawn_detached(
        state,
        correlation_id,
        {"gate": str(state / "never")},
        handler=f"{HANDLERS}:gated",
        deadline_s=deadline_s,
        meta={"k": 1},
    )
    wait_until(lambda: marker_of(state, correlation_id).get("pid") is not None)
    return Marker.from_json(marker_of(state, correlation_id))


def stepped(marker: Marker, *, after_s: float, wall_step_s: float) -> Clocks:
    """``after_s`` seconds after the marker's start on the boot clock, the wall clock stepped.

    (Not at the deadline to the last bit: ``start + 60 - start`` need not be 60 in floats.)
    """
    assert marker.started_boot_s is not None
    boot = marker.started_boot_s + after_s
    return Clocks(boot=lambda: boot, wall=lambda: time.time() + wall_step_s)


@pytest.mark.parametrize("wall_step_s", [60.0, -60.0])
def test_a_wall_clock_step_neither_shortens_nor_lengthens_a_live_workers_time(
    tmp_path: Path, wall_step_s: float
) -> None:
    state = tmp_path / "state"
    marker = spawn_gated(state, "w-1", deadline_s=60)
    try:
        inbox = Inbox()
        early = stepped(marker, after_s=59.0, wall_step_s=wall_step_s)
        assert sweep(state, inbox, clocks=early).expired == []
        assert inbox.sent == [] and in_flight(state)
        assert marker.pid is not None and process_start_time(marker.pid) == marker.start_time
        on_time = stepped(marker, after_s=60.5, wall_step_s=wall_step_s)
        assert sweep(state, inbox, clocks=on_time).expired == ["w-1"]
        ((_, result),) = inbox.sent
        assert result["error"]["code"] == "TASK_TIMEOUT" and result["meta"] == {"k": 1}
        wait_until(lambda: process_start_time(marker.pid or 0) is None)  # killed by the sweep
    finally:
        stop_worker(marker.pid, marker.start_time)


def test_a_dead_worker_is_expired_on_time_while_the_wall_clock_is_stepped_back(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    marker = spawn_gated(state, "w-2", deadline_s=30)
    assert marker.pid is not None
    os.kill(marker.pid, signal.SIGKILL)
    wait_until(lambda: process_start_time(marker.pid or 0) is None)
    inbox = Inbox()
    before = stepped(marker, after_s=29.0, wall_step_s=-3600.0)
    assert sweep(state, inbox, clocks=before).expired == []  # dead, but before its deadline
    at_deadline = stepped(marker, after_s=30.5, wall_step_s=-3600.0)
    assert sweep(state, inbox, clocks=at_deadline).expired == ["w-2"]
    ((_, result),) = inbox.sent
    assert result["error"]["code"] == "WORKER_DIED"
    assert not in_flight(state)


def test_a_marker_from_another_boot_is_expired_at_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    marker = Marker.new("b-1", 3600, {"k": 1}, clocks=fixed_clocks(100.0, 1.7e9, "boot-1"))
    write_atomically(state / "b-1.running", marker.to_json())
    inbox = Inbox()
    assert sweep(state, inbox, clocks=fixed_clocks(100.0, 1.7e9, "boot-1")).expired == []
    # The machine restarted: its clock started again, and no worker of the old boot lives.
    assert sweep(state, inbox, clocks=fixed_clocks(5.0, 1.7e9, "boot-2")).expired == ["b-1"]
    ((_, result),) = inbox.sent
    assert result["error"]["code"] == "WORKER_DIED"
    assert "restarted" in result["error"]["message"]


def test_a_start_in_the_future_is_warned_about_and_expired_one_full_deadline_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="async_task_api_worker.detached")
    state = tmp_path / "state"
    state.mkdir()
    now = 1000.0
    # A copied or hand-edited file: handed out 500 s from now on this boot's clock.
    marker = Marker.new("f-1", 30, {"k": 1}, clocks=fixed_clocks(now + 500, 1.7e9))
    write_atomically(state / "f-1.running", marker.to_json())

    def future_warnings() -> list[str]:
        return [
            record.getMessage()
            for record in caplog.records
            if record.levelno == logging.WARNING and "in the future" in record.getMessage()
        ]

    inbox = Inbox()
    assert sweep(state, inbox, clocks=fixed_clocks(now, 1.7e9)).expired == []
    (warning,) = future_warnings()
    assert "f-1" in warning
    assert marker_of(state, "f-1")["started_boot_s"] == now  # taken as handed out now
    caplog.clear()
    assert sweep(state, inbox, clocks=fixed_clocks(now + 29, 1.7e9)).expired == []
    assert future_warnings() == []
    assert sweep(state, inbox, clocks=fixed_clocks(now + 30, 1.7e9)).expired == ["f-1"]
    assert [result["meta"] for _, result in inbox.sent] == [{"k": 1}]


def test_a_marker_without_the_boot_fields_follows_its_wall_deadline(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    wall = 1.7e9
    document = json.loads(Marker.new("o-1", 30, {}, clocks=fixed_clocks(10.0, wall)).to_json())
    del document["started_boot_s"], document["deadline_s"]  # written before them
    (state / "o-1.running").write_text(json.dumps(document))
    inbox = Inbox()
    assert sweep(state, inbox, clocks=fixed_clocks(10_000.0, wall + 29)).expired == []
    assert sweep(state, inbox, clocks=fixed_clocks(10.0, wall + 31)).expired == ["o-1"]


class ManualClock:
    """A boot clock the test moves; it counts its reads."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.reads = 0
        self._read = threading.Condition()

    def __call__(self) -> float:
        with self._read:
            self.reads += 1
            self._read.notify_all()
        return self.now

    def wait_reads(self, count: int) -> None:
        with self._read:
            assert self._read.wait_for(lambda: self.reads >= count, timeout=30), "timed out"


@pytest.mark.parametrize("wall_step_s", [3600.0, -3600.0])
def test_the_workers_own_watchdog_counts_on_the_boot_clock(
    tmp_path: Path, wall_step_s: float
) -> None:
    boot = ManualClock(500.0)
    marker = Marker.new("d-1", 60, {"k": 1}, clocks=Clocks(boot=boot, wall=time.time))
    write_atomically(tmp_path / "d-1.running", marker.to_json())
    clocks = Clocks(boot=boot, wall=lambda: time.time() + wall_step_s)
    killed = threading.Event()
    stop = watch_deadline(tmp_path, "d-1", marker, clocks=clocks, kill=killed.set)
    try:
        boot.now = 559.0
        reads = boot.reads
        boot.wait_reads(reads + 2)  # it looked at the clock at 59 s, twice: no deadline yet
        assert not killed.is_set() and not (tmp_path / "d-1.json").exists()
        boot.now = 560.0
        assert killed.wait(30)
    finally:
        stop.set()
    result = read_json(tmp_path / "d-1.json")
    assert result["error"]["code"] == "TASK_TIMEOUT" and result["meta"] == {"k": 1}
    assert not (tmp_path / "d-1.running").exists()


def test_the_watchdog_takes_a_start_in_the_future_as_now(tmp_path: Path) -> None:
    boot = ManualClock(1000.0)
    marker = Marker.new("d-2", 60, {}, clocks=fixed_clocks(5000.0, time.time()))
    write_atomically(tmp_path / "d-2.running", marker.to_json())
    clocks = Clocks(boot=boot, wall=time.time, this_boot=lambda: "boot-1")
    killed = threading.Event()
    stop = watch_deadline(tmp_path, "d-2", marker, clocks=clocks, kill=killed.set)
    try:
        boot.now = 1060.0  # a full deadline after now, not 4000 s more
        assert killed.wait(30)
    finally:
        stop.set()
    assert read_json(tmp_path / "d-2.json")["error"]["code"] == "TASK_TIMEOUT"


def test_a_tasks_time_runs_from_its_workers_start_not_from_the_hand_out(tmp_path: Path) -> None:
    state = tmp_path / "state"
    handed = spawn_detached(
        state, "k-9", {"seconds": 30}, handler=f"{HANDLERS}:slow", deadline_s=30
    )
    wait_until(lambda: marker_of(state, "k-9").get("pid"))
    started = Marker.from_json(marker_of(state, "k-9"))
    try:
        # The worker's interpreter start is not the task's time.
        assert started.started_boot_s is not None and handed.started_boot_s is not None
        assert started.started_boot_s > handed.started_boot_s
        assert started.deadline_s == handed.deadline_s == 30
    finally:
        stop_worker(started.pid, started.start_time)
