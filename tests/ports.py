"""Ports and node names of a test's own, so that runs side by side never collide.

A test that listens, or starts a RabbitMQ node, takes its ports and node name from here, never a
fixed number: another run on the same machine (a second checkout, CI beside a developer, the
other xdist workers of this run) may hold any fixed one. A port is free when it can be bound on
127.0.0.1 right now; the pick is random, so that two runs probing at once rarely pick the same.

``.ci/run``'s own RabbitMQ 4.0 and 4.3 nodes and moto's ``MOTO_PORT`` are CI's: the tests only
read the environment variables that name them.
"""

from __future__ import annotations

import random
import socket
import uuid

__all__ = ["free_port", "node_port", "node_name"]

#: RabbitMQ's distribution port defaults to the AMQP port + 20000 (``scripts/rabbitmq_nodes.py``,
#: also for the members of a cluster): node ports are drawn below the ephemeral range so that
#: both stay under 65536.
DIST_PORT_OFFSET = 20000
NODE_PORTS = range(10000, 30000)


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, chosen by the kernel."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def node_port(taken: set[int] | None = None) -> int:
    """An AMQP port for a RabbitMQ node whose distribution port (``+ 20000``) is free too.

    Args:
        taken: ports already picked for other nodes of the same test (not picked again).
    """
    taken = taken if taken is not None else set()
    for _ in range(200):
        port = random.randrange(NODE_PORTS.start, NODE_PORTS.stop)
        pair = {port, port + DIST_PORT_OFFSET}
        if not pair & taken and all(_bindable(each) for each in pair):
            taken.update(pair)
            return port
    raise RuntimeError(f"no free pair of ports (AMQP, AMQP + {DIST_PORT_OFFSET}) found")


def node_name(prefix: str) -> str:
    """A RabbitMQ node name no other run holds: ``PREFIX-<8 hex digits>``."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
