"""What a refused connection says: the vhost and the command that grants access to it."""

from __future__ import annotations

import aiormq
import pytest

from async_task_api_worker.errors import BrokerRefusedError, TransportError
from async_task_api_worker.transports.rabbitmq.failures import connect_failure, refused, setup_error

NO_OPEN_OK = aiormq.exceptions.InvalidFrameError(
    "Expected one of ['Connection.OpenOk'], got <Connection.Close object at 0x7f>"
)


@pytest.mark.parametrize(
    ("url", "vhost", "grant"),
    [
        ("amqp://guest:***@localhost:5672/work", "'work'", "-p work guest"),
        ("amqp://ann:***@localhost:5672/", "'/'", "-p / ann"),
        ("amqp://ann:***@localhost:5672/%2F", "'/'", "-p / ann"),
        ("amqp://ann:***@localhost:5672/my%20work", "'my work'", "-p 'my work' ann"),
        ("amqp://localhost/work", "'work'", "-p work guest"),  # aiormq's default user
    ],
)
def test_a_vhost_refusal_names_the_vhost_and_the_command_that_grants_it(
    url: str, vhost: str, grant: str
) -> None:
    message = str(refused(NO_OPEN_OK, url))
    assert message.startswith(f"access to vhost {vhost} was refused for user ")
    assert f"rabbitmqctl set_permissions {grant} '.*' '.*' '.*'" in message
    assert "InvalidFrame" not in message


def test_refused_credentials_stay_a_credentials_error() -> None:
    login = aiormq.exceptions.ProbableAuthenticationError(
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN."
    )
    assert "refused the credentials" in str(refused(login, "amqp://u:***@h:5672/"))


def test_a_queue_refusal_is_refused_and_any_other_set_up_failure_a_transport_error() -> None:
    queue = aiormq.exceptions.ChannelAccessRefused(
        "ACCESS_REFUSED - access to queue 'q' in vhost 'v' refused for user 'u'"
    )
    error = setup_error(queue, "amqp://u:***@h:5672/v")
    assert isinstance(error, BrokerRefusedError)
    assert str(error).endswith("refused access: " + str(queue))
    other = setup_error(aiormq.exceptions.ChannelNotFoundEntity("NOT_FOUND"), "amqp://h/")
    assert type(other) is TransportError
    assert str(other) == "could not set up the queues: ChannelNotFoundEntity"


def test_a_failed_connect_says_its_cause_not_the_wrappers_type() -> None:
    refused_socket = ConnectionRefusedError(111, "Connection refused")
    wrapped = aiormq.exceptions.AMQPConnectionError(111, "Connect call failed")
    wrapped.__cause__ = refused_socket
    assert connect_failure(wrapped) == "connection refused"
    assert connect_failure(TimeoutError()) == "timed out"
    unreachable = aiormq.exceptions.AMQPConnectionError(113, "Connect call failed")
    unreachable.__cause__ = OSError(113, "No route to host")
    assert connect_failure(unreachable) == "No route to host"  # the system's words
    assert connect_failure(ValueError("x")) == "ValueError"  # nothing better: its type


def test_a_connection_the_broker_closed_says_its_reply_not_an_unknown_errno() -> None:
    # What aiormq raises when a node stops or `rabbitmqctl close_connection` runs: its errno
    # is the AMQP reply code, which the system's words called "Unknown error 320".
    forced = aiormq.exceptions.ConnectionClosed(
        320, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
    )
    assert connect_failure(forced) == (
        "closed by the broker: 320 CONNECTION_FORCED - broker forced connection closure with "
        "reason 'shutdown'"
    )
