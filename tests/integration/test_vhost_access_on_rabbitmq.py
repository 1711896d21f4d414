"""A vhost the user may not use: ``run`` and ``submit`` say access was refused, and exit 2."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.integration.conftest import BROKER_USER, Queues, rabbitmqctl
from tests.integration.test_cli_on_rabbitmq import cli

COMMANDS = [
    ("run", "examples.count_words:worker"),
    ("submit", '{"text": "a"}', "--service", "count-words"),
]


@pytest.fixture(scope="module")
def vhost_without_permissions(broker: None) -> Iterator[str]:
    """A vhost on which the tests' user has no permissions at all."""
    name = f"atw-noperm-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", name)
    yield name
    rabbitmqctl("delete_vhost", name)


@pytest.fixture(scope="module")
def vhost_without_queue_permissions(broker: None) -> Iterator[str]:
    """A vhost the tests' user may open but in which it may declare no queue."""
    name = f"atw-noqueue-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", name)
    rabbitmqctl("set_permissions", "-p", name, BROKER_USER, "^amq\\.", "", "")
    yield name
    rabbitmqctl("delete_vhost", name)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS, ids=["run", "submit"])
def test_a_vhost_without_permissions_is_access_refused_naming_the_vhost(
    vhost_without_permissions: str, command: tuple[str, ...]
) -> None:
    vhost = vhost_without_permissions
    done = cli(*command, env=Queues(vhost).env())
    assert done.returncode == 2, done.stderr
    line = one_line(done.stderr)
    assert f"access to vhost '{vhost}' was refused for user '{BROKER_USER}'" in line
    assert f"rabbitmqctl set_permissions -p {vhost} {BROKER_USER} '.*' '.*' '.*'" in line
    assert "InvalidFrameError" not in line


@pytest.mark.parametrize("command", COMMANDS, ids=["run", "submit"])
def test_a_queue_the_user_may_not_declare_is_access_refused_in_the_brokers_words(
    vhost_without_queue_permissions: str, command: tuple[str, ...]
) -> None:
    queues = Queues(vhost_without_queue_permissions)
    done = cli(*command, env=queues.env())
    assert done.returncode == 2, done.stderr
    line = one_line(done.stderr)
    assert "refused access: ACCESS_REFUSED - " in line
    # RabbitMQ 4 says "configure access to queue ...", 3.x "access to queue ...".
    assert (
        f"access to queue '{queues.in_queue}' in vhost '{queues.vhost}' refused for user "
        f"'{BROKER_USER}'"
    ) in line
    assert "credentials" not in line
