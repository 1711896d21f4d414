"""The node tooling's waits on its CLI (``scripts/rabbitmq_nodes.py``): a ``rabbitmqctl`` that
does not answer costs the boot's whole deadline, never less, and never blocks a stop.

The node here is a stand-in: ``rabbitmq-server`` writes its pid file and becomes a process named
``beam.smp`` (a copy of ``sleep``); ``rabbitmqctl`` hangs on the commands listed in a file, in a
child of its script like the real one's Erlang VM (``cli-vm``, another copy of ``sleep``), which
a timed-out call must not leave behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts import rabbitmq_nodes
from scripts.rabbitmq_nodes import Node, NodeError, NodeSpec
from tests.ports import node_port

# With a file `slow`, the server runs without writing its pid file (a boot not that far yet).
SERVER = (
    '#!/bin/sh\n[ -e "$(dirname "$0")/slow" ] && exec "$(dirname "$0")/beam.smp" 600\n'
    'echo $$ > "$RABBITMQ_PID_FILE"\necho $$ > "$(dirname "$0")/booted"\n'
    'exec "$(dirname "$0")/beam.smp" 600\n'
)
# $1 -n, $2 the node, $3 the command: hang on the commands the file `hang` names.
# The real script runs its VM as a child (no exec), so the VM outlives a kill of the script alone.
# await_startup answers 0 only once the server runs as beam.smp, as the real one does.
CTL = (
    '#!/bin/sh\ngrep -qx "$3" "$(dirname "$0")/hang" && "$(dirname "$0")/cli-vm" 600\n'
    '[ "$3" = await_startup ] || exit 0\n'
    'pid=$(cat "$(dirname "$0")/booted" 2>/dev/null) || exit 1\n'
    '[ "$(cat /proc/"$pid"/comm 2>/dev/null)" = beam.smp ]\n'
)


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    binaries = tmp_path / "bin"
    binaries.mkdir()
    for copy in ("beam.smp", "cli-vm"):
        shutil.copy(shutil.which("sleep") or "/bin/sleep", binaries / copy)
    for name, text in (("rabbitmq-server", SERVER), ("rabbitmqctl", CTL)):
        (binaries / name).write_text(text)
        (binaries / name).chmod(0o755)
    (binaries / "hang").write_text("")
    monkeypatch.setattr(rabbitmq_nodes, "HOST_BIN", binaries)
    stand_in = Node(NodeSpec(name="atw-unit-waits", port=node_port(), base_dir=tmp_path / "node"))
    yield stand_in
    if (pid := stand_in.pid) is not None:  # a failed case leaves no process behind
        os.kill(pid, signal.SIGKILL)
    for pid in _cli_vms() + _cli_vms("beam.smp"):
        os.kill(pid, signal.SIGKILL)


def _cli_vms(name: str = "cli-vm") -> list[int]:
    """The pids of the stand-in CLI's VMs (or of the stand-in's ``name``) that run."""
    wanted = str(rabbitmq_nodes.HOST_BIN / name)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].decode(errors="replace") == wanted and rabbitmq_nodes._alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _hang_on(node: Node, *commands: str) -> None:
    (rabbitmq_nodes.HOST_BIN / "hang").write_text("".join(f"{c}\n" for c in commands))


def test_a_cli_that_never_answers_fails_the_boot_at_its_deadline(node: Node) -> None:
    # Before: one await_startup call had 30 s of its own, and its timeout ended the boot
    # whatever time the boot had left (CI: three 4.3 nodes booting under load).
    _hang_on(node, "await_startup")
    with pytest.raises(NodeError, match="did not start within 2 s"):
        node.start(timeout_s=2)
    assert not node.running  # the failed boot's process is killed
    assert _cli_vms() == []  # and the timed-out CLI's VM with its script


def test_a_boot_that_runs_out_of_time_before_its_pid_file_leaves_no_server(node: Node) -> None:
    # Before: only the pid file's process was killed, so this server ran on (and a real one
    # booted a node after its start had failed).
    _hang_on(node, "await_startup")
    (rabbitmq_nodes.HOST_BIN / "slow").write_text("")
    with pytest.raises(NodeError, match="did not start within 2 s"):
        node.start(timeout_s=2)
    assert _cli_vms("beam.smp") == []


def test_a_cli_that_never_answers_leaves_no_process_at_the_deadline_of_a_call(node: Node) -> None:
    node.start(timeout_s=30)
    _hang_on(node, "status")
    with pytest.raises(NodeError, match="no answer within 1 s"):
        node.ctl("status", timeout_s=1)
    assert _cli_vms() == []


def test_a_stop_whose_cli_does_not_answer_ends_the_process_by_signals(node: Node) -> None:
    node.start(timeout_s=30)
    assert node.running
    _hang_on(node, "stop")
    node.stop(timeout_s=1)
    assert _cli_vms() == []  # the timed-out CLI's VM is gone with its script
    assert not node.running


def test_a_frozen_node_ends_on_sigterm_not_at_sigkill(node: Node) -> None:
    # Before: SIGTERM stayed pending on the stopped process, and the stop waited half its time
    # for SIGKILL (a real frozen 4.3 node: 90 s of stop, 30 of them after SIGTERM).
    node.start(timeout_s=30)
    pid = node.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    began = time.monotonic()
    node.stop(timeout_s=20)  # the stand-in CLI's stop answers at once and stops nothing
    assert time.monotonic() - began < 10  # 5 s for the CLI's stop to show, then SIGTERM
    assert _cli_vms("beam.smp") == []
