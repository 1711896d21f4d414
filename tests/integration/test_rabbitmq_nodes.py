"""scripts/rabbitmq_nodes.py: nodes of the tests' own, clusters, 4.0 and 4.3 nodes in their roots.

Each node has a name and free ports of its own (``tests/ports.py``: AMQP, distribution, a 4.0
or 4.3 node's epmd), so that the tests run next to each other and next to any other run's nodes on
the machine (``.ci/run``'s 4.0 and 4.3 nodes, the fault suite's, another checkout's). Every node is
stopped and its files deleted afterwards, also when the test fails (``running_node``,
``running_cluster``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import aio_pika
import aiormq.exceptions
import pytest

from scripts.rabbitmq_nodes import (
    HOST_BIN,
    ROOTS,
    Node,
    NodeError,
    NodeSpec,
    default_root,
    root_ready,
    running_cluster,
    running_node,
)
from tests.ports import free_port, node_name, node_port

MAX_MESSAGE_SIZE = 1024 * 1024


def _needed(ready: bool, message: str) -> None:
    if not ready:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: integration tests must run)")
        pytest.skip(message)


def _epmd_port(version: str) -> int:
    """A free epmd port for a 4.0 or 4.3 node, whose root must be there; 0 (the machine's) for
    3.10."""
    if version not in ROOTS:
        return 0
    root = default_root(version)
    _needed(root_ready(root), f"no RabbitMQ {version} root at {root} (rabbitmq_nodes.py root)")
    return free_port()


@pytest.fixture(autouse=True)
def tooling() -> None:
    """Nodes need root (chroot, mount, the shared cookie) and the machine's RabbitMQ 3.10."""
    _needed(os.geteuid() == 0, "starting RabbitMQ nodes needs root")
    _needed((HOST_BIN / "rabbitmq-server").exists(), f"no {HOST_BIN / 'rabbitmq-server'}")


@pytest.mark.timeout(120)
async def test_a_message_above_max_message_size_closes_the_channel(tmp_path: Path) -> None:
    port = node_port()
    spec = NodeSpec(
        name=node_name("atw-t-size"), port=port, base_dir=tmp_path / "node",
        conf={"max_message_size": str(MAX_MESSAGE_SIZE)},
    )  # fmt: skip
    with running_node(spec) as node:
        assert node.url("a/b") == f"amqp://guest:guest@127.0.0.1:{port}/a%2Fb"
        connection = await aio_pika.connect(node.url())
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue("sized", durable=True)
            fits = aio_pika.Message(b"x" * MAX_MESSAGE_SIZE)
            await channel.default_exchange.publish(fits, routing_key=queue.name)
            too_big = aio_pika.Message(b"x" * (MAX_MESSAGE_SIZE + 1))
            with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as closed:
                await channel.default_exchange.publish(too_big, routing_key=queue.name)
            assert "PRECONDITION_FAILED" in str(closed.value)
            assert "larger than configured max size" in str(closed.value)
        listed = json.loads(node.ctl("list_queues", "name", "messages", "--formatter", "json"))
        assert listed == [{"name": "sized", "messages": 1}]
    assert not node.running
    assert not node.base_dir.exists()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("version", ["3.10", "4.3"])
async def test_a_three_node_cluster_runs_and_stops(tmp_path: Path, version: str) -> None:
    epmd_port = _epmd_port(version)
    taken: set[int] = set()
    members = [(node_name(f"atw-t-c{i}"), node_port(taken)) for i in range(1, 4)]
    # A 4.3 node's base directory must lie in its root: the default one there.
    base_dir = None if version in ROOTS else tmp_path
    with running_cluster(members, version=version, base_dir=base_dir, epmd_port=epmd_port) as nodes:
        names = sorted(node.nodename for node in nodes)
        for node in nodes:
            status = json.loads(node.ctl("cluster_status", "--formatter", "json"))
            assert sorted(status["running_nodes"]) == names
        connection = await aio_pika.connect(nodes[1].url())
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(
                "replicated", durable=True, arguments={"x-queue-type": "quorum"}
            )
        assert nodes[2].leader_of("replicated") in names
        assert nodes[0].server_version().startswith(f"{version}.")
    assert not any(node.running for node in nodes)
    assert not any(node.base_dir.exists() for node in nodes)


@pytest.mark.timeout(120)
def test_a_node_that_cannot_boot_raises_with_its_log_and_leaves_nothing(tmp_path: Path) -> None:
    spec = NodeSpec(
        name=node_name("atw-t-bad"),
        port=node_port(),
        base_dir=tmp_path / "node",
        conf={"no_such_setting": "1"},
    )
    with pytest.raises(NodeError, match="exited while starting") as failed, running_node(spec):
        pytest.fail("the node started")
    assert "no_such_setting" in str(failed.value)
    assert not Node(spec).running
    assert not (tmp_path / "node").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("version", ["4.0", "4.3"])
async def test_a_node_runs_in_its_debian_root(version: str) -> None:
    epmd_port = _epmd_port(version)
    name = node_name(f"atw-t-{version.replace('.', '')}")
    spec = NodeSpec(name=name, port=node_port(), version=version, epmd_port=epmd_port)
    with running_node(spec) as node:
        assert re.fullmatch(rf"{re.escape(version)}\.\d+", node.server_version())
        connection = await aio_pika.connect(node.url())
        async with connection:
            assert connection.transport is not None
            properties = connection.transport.connection.server_properties
            assert str(properties["version"]).startswith(f"{version}.")
        # ATW_RABBITMQCTL is the command joined for a shell; split again, it still works.
        command = shlex.split(shlex.join(node.ctl_command()))
        done = subprocess.run(
            [*command, "eval", "node()."], capture_output=True, text=True, timeout=60, check=True
        )
        assert done.stdout.strip() == f"'{name}@localhost'"
    assert not node.running
    assert not node.base_dir.exists()
