"""Detached workers as real processes: results, dead workers, identity, concurrent sweeps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.detached import Marker, in_flight, spawn_detached, sweep
from async_task_api_worker.detached.claims import process_start_time
from async_task_api_worker.detached.state import write_atomically
from tests.unit.detached.support import HANDLERS, Inbox, marker_of, wait_until


def test_a_finished_result_is_delivered_once_and_the_guard_follows_the_marker(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    spawn_detached(
        state, "c-1", {"seconds": 0.5}, handler=f"{HANDLERS}:slow", deadline_s=30, meta={"k": 1}
    )
    assert in_flight(state)
    wait_until((state / "c-1.json").exists)
    assert not in_flight(state)
    inbox = Inbox()
    report = sweep(state, inbox)
    assert report.delivered == ["c-1"]
    ((correlation_id, result),) = inbox.sent
    assert correlation_id == "c-1"
    assert result["ok"] is True and result["response"] == {"slept": 0.5}
    assert result["meta"] == {"k": 1} and result["correlation_id"] == "c-1"
    assert sweep(state, inbox).delivered == []  # once
    assert sorted(p.name for p in state.iterdir()) == ["c-1.done"]  # the record of the send


def test_a_crash_is_a_structured_error_result(tmp_path: Path) -> None:
    state = tmp_path / "state"
    spawn_detached(state, "c-2", {}, handler=f"{HANDLERS}:crash", deadline_s=30)
    spawn_detached(state, "c-3", {}, handler=f"{HANDLERS}:refuse", deadline_s=30)
    wait_until(lambda: (state / "c-2.json").exists() and (state / "c-3.json").exists())
    inbox = Inbox()
    sweep(state, inbox)
    results = dict(inbox.sent)
    # The task call's words, as in every face (task_call.conclude_error).
    assert results["c-2"]["error"] == {
        "code": "INTERNAL_ERROR",
        "message": "the task failed with an internal error",
        "retryable": False,
        "retry_delay_s": None,
    }
    assert "hunter2" not in json.dumps(results["c-2"])
    assert results["c-3"]["error"]["code"] == "NOT_ALLOWED"
    assert results["c-3"]["error"]["message"] == "No."


def test_a_killed_worker_is_reported_once_after_its_deadline_and_not_before(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    spawn_detached(state, "c-4", {"seconds": 60}, handler=f"{HANDLERS}:slow", deadline_s=2)
    wait_until(lambda: marker_of(state, "c-4").get("pid") is not None)
    pid = marker_of(state, "c-4")["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: process_start_time(pid) is None)
    inbox = Inbox()
    assert sweep(state, inbox).expired == []  # before the deadline: nothing
    assert inbox.sent == [] and in_flight(state)
    wait_until(lambda: Marker.from_json(marker_of(state, "c-4")).past_deadline)
    assert sweep(state, inbox).expired == ["c-4"]
    ((_, result),) = inbox.sent
    assert result["error"]["code"] == "WORKER_DIED"
    assert sweep(state, inbox).expired == []
    assert len(inbox.sent) == 1 and not in_flight(state)


def test_a_second_hand_out_of_work_out_already_starts_nothing(tmp_path: Path) -> None:
    # Two ticks handing out one task at once (one lost its link, the other got the redelivery):
    # the marker's write is exclusive, so one commits and the other starts nothing.
    state = tmp_path / "state"
    spawn_detached(state, "c-9", {"seconds": 60}, handler=f"{HANDLERS}:slow", deadline_s=30)
    wait_until(lambda: marker_of(state, "c-9").get("pid") is not None)
    first = marker_of(state, "c-9")
    with pytest.raises(FileExistsError):
        spawn_detached(state, "c-9", {"seconds": 1}, handler=f"{HANDLERS}:slow", deadline_s=30)
    assert marker_of(state, "c-9") == first
    assert sorted(path.name for path in state.iterdir() if not path.name.endswith(".log")) == [
        "c-9.input",
        "c-9.running",
    ]
    os.kill(first["pid"], signal.SIGKILL)


@pytest.mark.parametrize(
    ("left", "forget_reported"),
    [
        ("c-10.running#claimed-1.2.3.x", True),  # its worker finishing
        ("c-10.json", True),  # its result, not reported yet
        ("c-10.json#claimed-1.2.3.x", True),  # its result, being reported
        ("c-10.done", False),  # reported: the tick's task ids name one task each
    ],
)
def test_a_hand_out_while_an_earlier_one_is_out_starts_nothing(
    tmp_path: Path, left: str, forget_reported: bool
) -> None:
    # Two copies of one task id reach two ticks; the first copy's work ends and is reported
    # while the second waits for its started confirm: the second must not run it again.
    state = tmp_path / "state"
    state.mkdir()
    (state / left).write_bytes(b"{}")
    with pytest.raises(FileExistsError):
        spawn_detached(
            state,
            "c-10",
            {},
            handler=f"{HANDLERS}:quick",
            deadline_s=30,
            forget_reported=forget_reported,
        )
    assert sorted(path.name for path in state.iterdir()) == [left]


def test_a_worker_past_its_deadline_stops_itself_with_task_timeout(tmp_path: Path) -> None:
    state = tmp_path / "state"
    spawn_detached(state, "c-5", {"seconds": 60}, handler=f"{HANDLERS}:slow", deadline_s=1)
    wait_until((state / "c-5.json").exists)
    inbox = Inbox()
    sweep(state, inbox)
    ((_, result),) = inbox.sent
    assert result["error"]["code"] == "TASK_TIMEOUT"


def test_a_live_pid_with_another_start_time_is_a_dead_worker(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        marker = Marker.new("c-6", -1, {"task_id": "c-6"})
        marker.pid = bystander.pid
        start = process_start_time(bystander.pid)
        assert start is not None
        marker.start_time = start - 1  # the pid was reused by another process
        write_atomically(state / "c-6.running", marker.to_json())
        inbox = Inbox()
        assert sweep(state, inbox).expired == ["c-6"]
        assert inbox.sent[0][1]["error"]["code"] == "WORKER_DIED"
        assert bystander.poll() is None  # not killed: it is not the worker
    finally:
        bystander.kill()
        bystander.wait()


def test_two_sweeps_at_once_deliver_each_result_and_marker_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    for number in range(20):
        write_atomically(
            state / f"r-{number}.json",
            json.dumps({"ok": True, "response": {}, "correlation_id": f"r-{number}"}).encode(),
        )
        write_atomically(state / f"m-{number}.running", Marker.new(f"m-{number}", -1, {}).to_json())
    inbox = Inbox()
    start = threading.Barrier(2)

    def one_sweep() -> None:
        start.wait()
        sweep(state, inbox)

    sweeps = [threading.Thread(target=one_sweep) for _ in range(2)]
    for thread in sweeps:
        thread.start()
    for thread in sweeps:
        thread.join()
    ids = [correlation_id for correlation_id, _ in inbox.sent]
    assert sorted(ids) == sorted({*ids})
    assert len(ids) == 40


def test_unreadable_files_are_moved_aside_and_the_sweep_goes_on(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    good = json.dumps({"ok": True, "response": {"n": 1}}).encode()
    write_atomically(state / "good.json", good)
    (state / "torn.json").write_bytes(good[: len(good) // 2])
    (state / "junk.running").write_bytes(b"\x00\xff garbage")
    inbox = Inbox()
    report = sweep(state, inbox)
    assert sorted(report.moved_aside) == ["junk.running", "torn.json"]
    assert len(list((state / "bad").iterdir())) == 2
    # Never silence: the task each file names hears that its outcome is lost.
    results = dict(inbox.sent)
    assert sorted(results) == ["good", "junk", "torn"]
    assert results["good"]["response"] == {"n": 1}
    assert results["torn"]["error"]["code"] == results["junk"]["error"]["code"] == "WORKER_DIED"


def test_a_handler_loaded_by_file_path_with_its_directory_importable(tmp_path: Path) -> None:
    code = tmp_path / "scripts"
    code.mkdir()
    (code / "helper.py").write_text("def double(n):\n    return n * 2\n")
    (code / "job.py").write_text(
        "import helper\n\ndef run(message):\n    return {'n': helper.double(message['n'])}\n"
    )
    state = tmp_path / "state"
    spawn_detached(state, "c-7", {"n": 21}, handler=f"{code / 'job.py'}:run", deadline_s=30)
    wait_until((state / "c-7.json").exists)
    inbox = Inbox()
    sweep(state, inbox)
    assert inbox.sent[0][1]["response"] == {"n": 42}


def test_a_spawn_failure_runs_the_work_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("no more processes")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    state = tmp_path / "state"
    spawn_detached(state, "c-8", {"x": 1}, handler=f"{HANDLERS}:quick", deadline_s=30)
    assert (state / "c-8.json").exists() and not in_flight(state)
    inbox = Inbox()
    sweep(state, inbox)
    assert inbox.sent[0][1]["response"] == {"echo": {"x": 1}}


@pytest.mark.parametrize("bad", ["../escape", "a/b", ".hidden", "", "x" * 200])
def test_a_correlation_id_must_be_a_safe_file_name(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="not a safe file name"):
        spawn_detached(tmp_path, bad, {}, handler=f"{HANDLERS}:quick", deadline_s=1)
    assert not any(tmp_path.iterdir())


def test_a_result_or_marker_whose_send_fails_is_sent_by_a_later_sweep(tmp_path: Path) -> None:
    from async_task_api_worker.detached.sweep import Undeliverable

    state = tmp_path / "state"
    state.mkdir()
    write_atomically(state / "r.json", json.dumps({"ok": True, "response": {}}).encode())
    write_atomically(state / "m.running", Marker.new("m", -1, {}).to_json())
    write_atomically(state / "a.json", json.dumps({"ok": True}).encode())  # swept first

    def broken(correlation_id: str, result: dict[str, Any]) -> None:
        if correlation_id == "a":
            raise Undeliverable("no task")
        raise ConnectionError("the broker is down")

    with pytest.raises(ConnectionError):
        sweep(state, broken)
    with pytest.raises(ConnectionError):
        sweep(state, broken)
    assert next(path.name for path in (state / "bad").iterdir()).startswith("a.json")
    inbox = Inbox()
    sweep(state, inbox)
    assert sorted(correlation_id for correlation_id, _ in inbox.sent) == ["m", "r"]


def test_a_marker_with_a_deadline_without_offset_is_moved_aside(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    marker = json.loads(Marker.new("n", -1, {}).to_json())
    marker["deadline_at"] = "2020-01-01T00:00:00"
    (state / "n.running").write_text(json.dumps(marker))
    report = sweep(state, Inbox())
    assert report.moved_aside == ["n.running"]


def test_a_tick_without_a_broker_exits_1_saying_why(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "async_task_api_worker",
            "tick",
            "tests.integration.workers:sleeping",
            "--state-dir",
            str(tmp_path),
            "--budget-s",
            "6",
        ],
        env={**os.environ, "BROKER_URL": "amqp://guest:guest@127.0.0.1:1/"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "the broker did not answer within 2 s" in done.stderr
    assert "leaves no room for new work" in done.stdout  # 6 s is all margin
