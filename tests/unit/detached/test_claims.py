"""What killed processes leave (issue 30): claims taken over once their maker is known dead,
temporary files and inputs of work not handed out removed, an outcome sent again the same."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from async_task_api_worker.detached import Marker, sweep
from async_task_api_worker.detached.claims import (
    STALE_CLAIM_S,
    Process,
    boot_id,
    claim,
    maker_of,
    process_start_time,
    temporary_for,
)
from async_task_api_worker.detached.state import write_atomically
from tests.unit.detached.support import Inbox, fixed_clocks, wait_until

RESULT = json.dumps({"ok": True, "response": {}}).encode()


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process of this test's, to stand for a sweep or a writer (alive, then killed)."""
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def identity(process: subprocess.Popen[bytes]) -> Process:
    start_time = process_start_time(process.pid)
    assert start_time is not None
    return Process(process.pid, start_time, boot_id())


def end(process: subprocess.Popen[bytes]) -> None:
    who = identity(process)
    process.kill()
    process.wait()
    # Not "its pid is gone": on a busy machine (pid_max 32768) another process may take the
    # pid at once, with another start time, and the maker is dead all the same.
    wait_until(lambda: not who.running(boot_id()))


def test_a_claim_and_a_temporary_name_carry_their_makers_identity(tmp_path: Path) -> None:
    this = Process.this()
    assert this is not None and this.running(boot_id())
    assert Process.from_tag(this.tag()) == this
    (tmp_path / "t-1.json").touch()
    claimed = claim(tmp_path / "t-1.json")
    assert claimed is not None and maker_of(claimed) == this
    assert claim(tmp_path / "t-1.json") is None  # someone was faster
    assert maker_of(temporary_for(tmp_path / "t-1.json.running")) == this
    for name in ("t-1.json#claimed-0a1b2c3d", ".t-1.json.0a1b2c3d.tmp", "t-1.json"):
        assert maker_of(tmp_path / name) is None  # no identity (names before issue 30)


def test_a_result_claimed_by_a_sweep_is_taken_over_as_soon_as_that_sweep_is_dead(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    claimed = tmp_path / f"r-1.json#claimed-{identity(bystander).tag()}.0a1b2c3d"
    write_atomically(claimed, RESULT)
    inbox = Inbox()
    assert sweep(tmp_path, inbox).delivered == []  # that sweep may be sending it right now
    assert claimed.exists()
    end(bystander)
    assert sweep(tmp_path, inbox).delivered == ["r-1"]
    assert sweep(tmp_path, inbox).delivered == [] and inbox.ids() == ["r-1"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["r-1.done"]


def test_a_marker_claimed_by_a_worker_that_died_is_expired_once_at_its_deadline(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    # The worker claims its marker before it writes its result: killed in between.
    marker = Marker.new("m-1", 30, {"task_id": "m-1"})
    claimed = tmp_path / f"m-1.running#claimed-{identity(bystander).tag()}.0a1b2c3d"
    write_atomically(claimed, marker.to_json())
    end(bystander)
    assert marker.started_boot_s is not None
    inbox = Inbox()
    before = fixed_clocks(marker.started_boot_s + 29, 1.7e9, marker.boot_id)
    assert sweep(tmp_path, inbox, clocks=before).expired == []
    late = fixed_clocks(marker.started_boot_s + 30, 1.7e9, marker.boot_id)
    assert sweep(tmp_path, inbox, clocks=late).expired == ["m-1"]
    assert sweep(tmp_path, inbox, clocks=late).expired == []
    ((_, result),) = inbox.sent
    assert result["error"]["code"] == "WORKER_DIED"


def test_a_claim_whose_name_carries_no_identity_is_taken_over_after_the_stale_claim_time(
    tmp_path: Path,
) -> None:
    claimed = tmp_path / "r-2.json#claimed-0a1b2c3d"  # a name from before issue 30
    write_atomically(claimed, RESULT)
    written = claimed.stat().st_mtime
    inbox = Inbox()
    assert sweep(tmp_path, inbox, clocks=fixed_clocks(0.0, written + STALE_CLAIM_S)).delivered == []
    later = fixed_clocks(0.0, written + STALE_CLAIM_S + 1)
    assert sweep(tmp_path, inbox, clocks=later).delivered == ["r-2"]


def test_temporary_files_are_removed_once_their_writer_is_dead(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    tag = identity(bystander).tag()
    live = tmp_path / f".t-3.input.{tag}.0a1b2c3d.tmp"
    unknown = tmp_path / ".t-3.running.0a1b2c3d0a1b2c3d0a1b2c3d0a1b2c3d.tmp"
    for path in (live, unknown):
        path.touch()
    written = unknown.stat().st_mtime
    at_stale_time = fixed_clocks(0.0, written + STALE_CLAIM_S, boot_id())
    sweep(tmp_path, Inbox(), clocks=at_stale_time)
    assert live.exists() and unknown.exists()  # a writer at work; one that may be
    end(bystander)
    sweep(tmp_path, Inbox(), clocks=at_stale_time)
    assert not live.exists() and unknown.exists()
    sweep(tmp_path, Inbox(), clocks=fixed_clocks(0.0, written + STALE_CLAIM_S + 1, boot_id()))
    assert not any(tmp_path.iterdir())


def test_an_input_whose_work_is_not_handed_out_is_removed(tmp_path: Path) -> None:
    for task_id in ("i-1", "i-2", "i-3"):
        write_atomically(tmp_path / f"{task_id}.input", b"{}")
    write_atomically(tmp_path / "i-2.running", Marker.new("i-2", 60, {}).to_json())
    (tmp_path / "i-3.done").touch()
    write_atomically(tmp_path / "i-4.input#claimed-1-2-another-boot.0a1b2c3d", b"{}")  # a sweep's
    sweep(tmp_path, Inbox())
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == ["i-2.input", "i-2.running", "i-3.done", "i-3.input"]


def test_a_sweep_killed_while_it_replaced_unreadable_files_leaves_one_outcome_each(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    # Killed after writing the replacements, before moving the bad files it held aside.
    tag = identity(bystander).tag()
    failure = {"ok": False, "error": {"code": "WORKER_DIED", "message": "lost"}}
    write_atomically(tmp_path / "b-1.json", json.dumps(failure).encode())
    write_atomically(tmp_path / f"b-1.json#claimed-{tag}.0a1b2c3d", b"garbage")
    write_atomically(tmp_path / "b-2.running", Marker.new("b-2", -1, {}).to_json())
    write_atomically(tmp_path / f"b-2.running#claimed-{tag}.0a1b2c3d", b"garbage")
    end(bystander)
    inbox = Inbox()
    report = sweep(tmp_path, inbox)
    assert sorted(report.moved_aside) == ["b-1.json", "b-2.running"]
    assert sorted(inbox.ids()) == ["b-1", "b-2"]
    assert sweep(tmp_path, inbox).moved_aside == [] and len(inbox.sent) == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == ["b-1.done", "b-2.done", "bad"]


# A sweep killed once its send returned (the report confirmed), before it recorded the send.
KILLED_AFTER_ITS_SEND = """
import json, os, sys
from async_task_api_worker.detached import sweep

def send(correlation_id, result):
    with open(sys.argv[2], "w") as sent:
        sent.write(json.dumps(result))
    os._exit(9)

sweep(sys.argv[1], send)
"""


@pytest.mark.parametrize("left", ["a result", "an expired marker"])
def test_an_outcome_sent_again_after_a_killed_sweep_is_the_same_result_at_once(
    tmp_path: Path, left: str
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    if left == "a result":
        write_atomically(state / "k-1.json", RESULT)
    else:
        write_atomically(state / "k-1.running", Marker.new("k-1", -1, {"task_id": "k-1"}).to_json())
    sent = tmp_path / "sent.json"
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_ITS_SEND, str(state), str(sent)], check=False
    )
    assert killed.returncode == 9
    first = json.loads(sent.read_text())
    assert first["report_timestamp"]  # the report's timestamp, kept with the claimed result
    inbox = Inbox()
    report = sweep(state, inbox)  # at once: the claim's maker is dead
    assert inbox.sent == [("k-1", first)]  # the same report, not another expiry
    assert (report.delivered, report.expired) == (
        (["k-1"], []) if left == "a result" else ([], ["k-1"])
    )
    assert sorted(path.name for path in state.iterdir()) == ["k-1.done"]
