"""The fault suite: real workers, real brokers, injected faults, every task id counted.

Broker-wide faults (restarts, alarms, a lowered ``max_message_size``, a cluster, RabbitMQ 4.0
and 4.3) get nodes of the suite's own, on free ports and with unique names (``tests/ports.py``,
``scripts/rabbitmq_nodes.py``); the machine's
broker on 5672 only ever gets vhosts of the suite's own. RabbitMQ 4.0 runs from the Debian 13
root, 4.3 from the Debian sid root (``python scripts/rabbitmq_nodes.py root [--version 4.3]``),
built the first time it is needed; where it cannot be built those cases skip, except under
``CI=true``, where they fail. The 4.0 and 4.3 rows (marked ``faults4``) and the kill storms
(marked ``storms``) run only when ``-m`` names that mark (``.ci/run`` runs them beside its 4.0
and 4.3 passes): the README's run must stay under 10 minutes.

The cases run one after another, on one xdist worker (the group ``faults``, ``tests/conftest.py``),
so that no two of them measure under each other's load. Each case adds a row to the fault table,
printed at the end of the run, and written as JSON lines to ``$ATW_FAULT_TABLE`` when it is set
(``docs/faults.md`` shows the last run's).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scripts.rabbitmq_nodes import ROOTS, Node, NodeSpec, build_root, default_root, root_ready
from tests.conftest import FAULT_ROW
from tests.faults.ledger import Supervisor
from tests.integration.conftest import BROKER_USER, broker_url, rabbitmqctl
from tests.ports import free_port, node_name, node_port


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the suite's cases; leave out the on-demand rows unless ``-m`` names their mark."""
    expression = config.getoption("markexpr", "") or ""
    not_asked = [mark for mark in ON_DEMAND_MARKS if mark not in expression]
    kept, left_out = [], []
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.faults)
            if any(item.get_closest_marker(mark) is not None for mark in not_asked):
                left_out.append(item)
                continue
        kept.append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


@pytest.fixture(autouse=True)
def no_worker_left_behind() -> Iterator[None]:
    """A case that fails half-way leaves no worker process running."""
    yield
    for supervisor in Supervisor.live:
        supervisor.kill_all()
    Supervisor.live.clear()


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Callable[[dict[str, object]], None]:
    """Add a row to the fault table (``tests/conftest.py`` prints it, also from xdist workers:
    the row travels with the test's report)."""

    def add(row: dict[str, object]) -> None:
        request.node.user_properties.append((FAULT_ROW, json.loads(json.dumps(row))))

    return add


@dataclass
class Broker:
    """Where a case runs: a node of the suite's own, or the machine's broker."""

    label: str
    node: Node | None = None
    vhosts: list[str] = field(default_factory=list)

    def url(self, vhost: str) -> str:
        if self.node is not None:
            return self.node.url(vhost)
        return broker_url(vhost)

    def ctl(self, *arguments: str) -> str:
        if self.node is not None:
            return self.node.ctl(*arguments)
        return rabbitmqctl(*arguments)

    def vhost(self, *, quorum: bool = True, delivery_limit: int | None = 20) -> str:
        """A fresh vhost (quorum queues by default, and a broker delivery limit above the
        worker's, as the docs ask); it goes with the broker, or is deleted by the fixture."""
        name = f"atw-fault-{uuid.uuid4().hex[:8]}"
        self.ctl("add_vhost", name, *(["--default-queue-type", "quorum"] if quorum else []))
        user = "guest" if self.node is not None else BROKER_USER
        self.ctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
        if quorum and delivery_limit is not None:
            self.ctl(
                "set_policy", "-p", name, "delivery-limit", ".*",
                json.dumps({"delivery-limit": delivery_limit}), "--apply-to", "queues",
            )  # fmt: skip
        self.vhosts.append(name)
        return name

    def counts(self, vhost: str, queue: str) -> tuple[int, int]:
        """``(ready, unacked)`` of ``queue``."""
        output = self.ctl(
            "list_queues", "-q", "-p", vhost, "name", "messages_ready", "messages_unacknowledged"
        )
        for line in output.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == queue:
                return int(parts[1]), int(parts[2])
        return (0, 0)

    def hung(self, vhost: str, queue: str, timeout_s: float = 30.0) -> int:
        """What ``queue`` still holds once it has had ``timeout_s`` to drain (0 is good);
        quorum queues publish their counts with a lag."""
        deadline = time.monotonic() + timeout_s
        while sum(counts := self.counts(vhost, queue)) and time.monotonic() < deadline:
            time.sleep(0.5)
        return sum(counts)


def the_machines() -> Iterator[Broker]:
    """The machine's broker (vhosts of the case's own, deleted afterwards)."""
    broker = Broker(label="3.10 (machine's)")
    try:
        rabbitmqctl("status")
    except Exception as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the machine's RabbitMQ is not usable: {exc}")
        pytest.skip(f"the machine's RabbitMQ is not usable: {exc}")
    yield broker
    for vhost in broker.vhosts:
        rabbitmqctl("delete_vhost", vhost)


@pytest.fixture
def machine_broker() -> Iterator[Broker]:
    """The machine's broker (vhosts of the case's own, deleted afterwards)."""
    yield from the_machines()


def _usable_root(version: str) -> Path:
    """The Debian root of ``version``'s nodes, built the first time (4.0: about 35 s; 4.3:
    about 100 s, debootstrap from Debian's archive); a case without one skips, or fails under
    ``CI=true``."""
    root = default_root(version)
    if not root_ready(root):
        try:
            build_root(root, version=version)
        except Exception as exc:
            message = f"no RabbitMQ {version} root at {root} and none could be built: {exc}"
            if os.environ.get("CI") == "true":
                pytest.fail(message)
            pytest.skip(message)
    return root


def version_spec(version: str) -> dict[str, Any]:
    """The ``NodeSpec`` (and ``running_cluster``) fields of ``version``'s nodes: for 4.0 and
    4.3, their root and an epmd of the case's own."""
    if version not in ROOTS:
        return {"version": version}
    return {"version": version, "root": _usable_root(version), "epmd_port": free_port()}


def own_node(version: str, **spec: Any) -> Iterator[Broker]:
    """A fresh node of the case's own (a name and free ports of its own, and for 4.x an epmd
    of its own); stopped and deleted afterwards."""
    name = node_name(f"atw-fault-{version.replace('.', '')}")
    node = Node(NodeSpec(name=name, port=node_port(), **version_spec(version), **spec))
    try:
        node.start(fresh=True)
        yield Broker(label=f"{node.server_version()} (own node)", node=node)
    finally:
        node.remove()


#: The versions whose rows run only when asked for (``-m faults4``), in ``.ci/run``'s RabbitMQ
#: 4.3 pass: the README's run must stay under 10 minutes on two cores.
ON_DEMAND = frozenset({"4.0", "4.3"})
ON_DEMAND_MARK = "faults4"
#: The marks of the rows that run only when ``-m`` names them: the 4.x rows, and the kill
#: storms and freezes of issue 30 (``-m storms``), which take minutes each.
ON_DEMAND_MARKS = (ON_DEMAND_MARK, "storms")


def on_versions(*versions: str, **spec: Any) -> list[Any]:
    """Indirect parameters of :func:`node`: one per version (``"machine"``: the machine's
    3.10), each with the ``NodeSpec`` fields ``spec`` (``conf``, ``advanced_config``); their
    ids are the versions, and a version of :data:`ON_DEMAND` is marked ``faults4``."""
    return [
        pytest.param(
            {"version": version, **spec},
            id=version,
            marks=[getattr(pytest.mark, ON_DEMAND_MARK)] if version in ON_DEMAND else [],
        )
        for version in versions
    ]


@pytest.fixture
def node(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A node of the case's own, of the version and spec of its indirect parameter
    (:func:`on_versions`), or the machine's broker (version ``"machine"``)."""
    spec = dict(request.param)
    version = spec.pop("version")
    if version == "machine":
        yield from the_machines()
    else:
        yield from own_node(version, **spec)


@pytest.fixture
def node_310(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A RabbitMQ 3.10 node of the case's own; indirect parameters are ``NodeSpec`` fields
    (``conf``, ``advanced_config``)."""
    yield from own_node("3.10", **getattr(request, "param", {}))


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    """The folder the handlers mark their calls in."""
    folder = tmp_path / "markers"
    folder.mkdir()
    return folder
