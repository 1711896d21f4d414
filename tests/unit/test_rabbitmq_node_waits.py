"""The node tooling's waits on its CLI (``scripts/rabbitmq_nodes.py``): a ``rabbitmqctl`` that
does not answer costs the boot's whole deadline, never less, and never blocks a stop.

The node here is a stand-in: ``rabbitmq-server`` writes its pid file and becomes a process named
``beam.smp`` (a copy of ``sleep``); ``rabbitmqctl`` hangs on the commands listed in a file.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts import rabbitmq_nodes
from scripts.rabbitmq_nodes import Node, NodeError, NodeSpec
from tests.ports import node_port

SERVER = '#!/bin/sh\necho $$ > "$RABBITMQ_PID_FILE"\nexec "$(dirname "$0")/beam.smp" 600\n'
# $1 -n, $2 the node, $3 the command: hang on the commands the file `hang` names.
CTL = '#!/bin/sh\ngrep -qx "$3" "$(dirname "$0")/hang" && exec sleep 600\nexit 0\n'


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    binaries = tmp_path / "bin"
    binaries.mkdir()
    shutil.copy(shutil.which("sleep") or "/bin/sleep", binaries / "beam.smp")
    for name, text in (("rabbitmq-server", SERVER), ("rabbitmqctl", CTL)):
        (binaries / name).write_text(text)
        (binaries / name).chmod(0o755)
    (binaries / "hang").write_text("")
    monkeypatch.setattr(rabbitmq_nodes, "HOST_BIN", binaries)
    stand_in = Node(NodeSpec(name="atw-unit-waits", port=node_port(), base_dir=tmp_path / "node"))
    yield stand_in
    if (pid := stand_in.pid) is not None:  # a failed case leaves no process behind
        os.kill(pid, signal.SIGKILL)


def _hang_on(node: Node, *commands: str) -> None:
    (rabbitmq_nodes.HOST_BIN / "hang").write_text("".join(f"{c}\n" for c in commands))


def test_a_cli_that_never_answers_fails_the_boot_at_its_deadline(node: Node) -> None:
    # Before: one await_startup call had 30 s of its own, and its timeout ended the boot
    # whatever time the boot had left (CI: three 4.3 nodes booting under load).
    _hang_on(node, "await_startup")
    with pytest.raises(NodeError, match="did not start within 2 s"):
        node.start(timeout_s=2)
    assert not node.running  # the failed boot's process is killed


def test_a_stop_whose_cli_does_not_answer_ends_the_process_by_signals(node: Node) -> None:
    node.start(timeout_s=30)
    assert node.running
    _hang_on(node, "stop")
    node.stop(timeout_s=1)
    assert not node.running
