"""Broker-free parts of the RabbitMQ adapter: header parsing, URL redaction, connect failures."""

from __future__ import annotations

import logging
import socket
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from async_task_api_worker.broker_rules import since_rabbitmq_4_3
from async_task_api_worker.errors import BrokerUnavailableError, PublishError
from async_task_api_worker.observability.redaction import redact_url
from async_task_api_worker.transports.rabbitmq import RabbitMQTransport
from async_task_api_worker.transports.rabbitmq.delivery import (
    acquired_count_of,
    delivery_count_of,
)
from async_task_api_worker.transports.rabbitmq.failures import publish_errors
from async_task_api_worker.transports.rabbitmq.link import with_heartbeat
from async_task_api_worker.transports.rabbitmq.topology import inequivalent_argument


@pytest.mark.parametrize(
    ("headers", "redelivered", "expected"),
    [
        ({}, False, 0),  # a first delivery: RabbitMQ sets no header
        ({}, True, 0),  # a quorum queue's redelivery without it: 4.3 after a give-back
        ({"x-delivery-count": 0}, False, 0),
        ({"x-delivery-count": 3}, True, 3),
        ({"x-delivery-count": Decimal(4)}, True, 4),
        ({"x-delivery-count": 2.0}, True, 2),
        ({"x-delivery-count": b"5"}, True, 5),
        ({"x-delivery-count": "6"}, True, 6),
        ({"x-delivery-count": -1}, True, 0),
        ({"x-delivery-count": True}, True, None),  # a bool is not a count
        ({"x-delivery-count": "many"}, True, None),
        ({"x-delivery-count": "\u00b2"}, True, None),  # str.isdigit() says yes; int() says no
        ({"x-delivery-count": "9" * 5000}, True, None),
        # A first delivery is attempt 1 whatever a producer forged (3.10 passes it through).
        ({"x-delivery-count": 7}, False, 0),
        ({"x-delivery-count": "many"}, False, 0),
        ({"x-delivery-count": 10**30}, True, 1_000_000_000),
        ({"x-delivery-count": Decimal("Infinity")}, True, None),
    ],
)
def test_the_delivery_count_is_read_from_any_integer_type(
    headers: dict[str, object], redelivered: bool, expected: int | None
) -> None:
    assert delivery_count_of(headers, redelivered, quorum=True) == expected


def test_a_classic_queue_keeps_no_count_not_even_of_a_first_delivery() -> None:
    # Its attempts are then read from ``redelivered`` under a limit of their own (2): a first
    # delivery's count of 0 would give it the full delivery limit in its decision line.
    assert delivery_count_of({"x-delivery-count": 3}, True, quorum=False) is None
    assert delivery_count_of({}, False, quorum=False) is None


def test_a_forged_delivery_count_left_by_a_4_3_give_back_is_capped_by_the_hand_outs() -> None:
    # Measured on 4.3.6: a producer's x-delivery-count 7 survives a nack; x-acquired-count is
    # the broker's own (1): at most one earlier delivery can have counted.
    headers = {"x-delivery-count": 7, "x-acquired-count": 1}
    assert delivery_count_of(headers, True, quorum=True, acquired=True) == 1
    assert delivery_count_of(headers, True, quorum=True, acquired=False) == 7  # 3.10, 4.0


@pytest.mark.parametrize(
    ("headers", "redelivered", "expected"),
    [
        ({}, False, 0),
        ({"x-acquired-count": 9}, False, 0),  # a producer's own, on a first delivery
        ({"x-acquired-count": 2}, True, 2),
        ({"x-acquired-count": b"3"}, True, 3),
        ({}, True, None),
        ({"x-acquired-count": "many"}, True, None),
    ],
)
def test_the_acquired_count_is_read_like_the_delivery_count(
    headers: dict[str, object], redelivered: bool, expected: int | None
) -> None:
    assert acquired_count_of(headers, redelivered) == expected


@pytest.mark.parametrize(
    ("version", "sets"),
    [(b"4.3.6", True), ("4.4.0", True), ("5.0.0-beta.1", True), (b"4.0.5", False),
     (b"3.10.8", False), (b"", False), (None, False), (b"x.y", False)],
)  # fmt: skip
def test_only_rabbitmq_4_3_and_later_set_the_acquired_count(version: object, sets: bool) -> None:
    assert since_rabbitmq_4_3(version) is sets


_HEADER_VALUES = st.one_of(
    st.none(),
    st.integers(),
    st.booleans(),
    st.floats(),
    st.decimals(),
    st.text(max_size=20),
    st.binary(max_size=20),
)


@given(
    delivered=_HEADER_VALUES,
    acquired=_HEADER_VALUES,
    redelivered=st.booleans(),
    quorum=st.booleans(),
    sets_acquired=st.booleans(),
)
def test_any_headers_give_a_count_in_range_never_an_error(
    delivered: object, acquired: object, redelivered: bool, quorum: bool, sets_acquired: bool
) -> None:
    headers = {"x-delivery-count": delivered, "x-acquired-count": acquired}
    count = delivery_count_of(headers, redelivered, quorum=quorum, acquired=sets_acquired)
    handed_out = acquired_count_of(headers, redelivered)
    for value in (count, handed_out):
        assert value is None or 0 <= value <= 1_000_000_000
    if not quorum:  # a classic queue keeps no count
        assert count is None
    elif not redelivered:  # a first delivery is the first, whatever a producer forged
        assert count == 0 and handed_out == 0
    elif sets_acquired and count is not None and handed_out is not None:
        assert count <= handed_out


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("amqp://user:s3cret@host:5672/vh", "amqp://user:***@host:5672/vh"),
        ("amqps://user:s3cret@host/vh?heartbeat=5", "amqps://user:***@host/vh?heartbeat=5"),
        ("amqp://user:s3cret@[::1]:5672/", "amqp://user:***@[::1]:5672/"),
        ("amqp://host:5672/", "amqp://host:5672/"),
        ("amqp://user:s3cret@host:notaport/", "(a URL that does not parse)"),
    ],
)
def test_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_an_unreachable_broker_is_retried_with_a_log_then_given_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="async_task_api_worker")
    transport = RabbitMQTransport(
        urls=[
            f"amqp://guest:s3cret@127.0.0.1:{_closed_port()}/",
            f"amqp://other:s3cret2@127.0.0.1:{_closed_port()}/",
        ],
        in_queue="in",
        out_queue="out",
        prefetch=1,
        connect_timeout_s=1.2,
    )
    with pytest.raises(BrokerUnavailableError, match=r"reachable within 1\.2 s") as error:
        await transport.connect()
    assert "s3cret" not in str(error.value)
    assert "guest:***@" in str(error.value) and "other:***@" in str(error.value)
    retries = [
        r.getMessage() for r in caplog.records if "Cannot reach the broker" in r.getMessage()
    ]
    assert retries
    assert all("s3cret" not in message and "***" in message for message in retries)
    assert transport.connected is False


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost 'v': "
            "received none but current is the value '10' of type 'byte'",
            ("x-max-length", 10),
        ),
        (
            "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'q' in "
            "vhost 'v': received none but current is the value 'dlx' of type 'longstr'",
            ("x-dead-letter-exchange", "dlx"),
        ),
        (
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost 'v': "
            "received the value 'quorum' of type 'longstr' but current is none",
            ("x-queue-type", None),
        ),
        (
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost 'v': "
            "received the value 'quorum' of type 'longstr' but current is the value 'stream' of "
            "type 'longstr'",
            ("x-queue-type", "stream"),
        ),
        (
            # RabbitMQ 3.10, a queue typed by its vhost's default (--default-queue-type).
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in vhost 'v': "
            "received 'quorum' but current is 'classic'",
            ("x-queue-type", "classic"),
        ),
        ("PRECONDITION_FAILED - message size 20 is larger than configured max size 10", None),
    ],
)
def test_the_argument_the_broker_names_is_read_from_its_reply(
    reply: str, expected: tuple[str, object] | None
) -> None:
    assert inequivalent_argument(reply) == expected


def test_each_url_asks_for_the_heartbeat_unless_it_names_its_own() -> None:
    assert with_heartbeat("amqp://u:p@h:5672/v", 15) == "amqp://u:p@h:5672/v?heartbeat=15"
    assert with_heartbeat("amqp://u:p@h/v?heartbeat=5", 15) == "amqp://u:p@h/v?heartbeat=5"


@given(
    argument=st.from_regex(r"x-[a-z-]{1,20}", fullmatch=True),
    value=st.one_of(st.integers(0, 10**9), st.from_regex(r"[a-z0-9_.-]{1,20}", fullmatch=True)),
    queue=st.text(alphabet=st.characters(blacklist_characters="'\n"), max_size=30),
)
def test_an_inequivalent_argument_reply_is_read_back_whatever_the_names(
    argument: str, value: int | str, queue: str
) -> None:
    kind = "long" if isinstance(value, int) else "longstr"
    reply = (
        f"PRECONDITION_FAILED - inequivalent arg '{argument}' for queue '{queue}' in vhost 'v': "
        f"received none but current is the value '{value}' of type '{kind}'"
    )
    assert inequivalent_argument(reply) == (argument, value)


@given(st.text())
def test_any_reply_is_read_without_raising(reply: str) -> None:
    named = inequivalent_argument(reply)
    assert named is None or isinstance(named[0], str)


def test_a_confirm_failed_with_a_bare_exception_is_a_publish_error_not_an_engine_error() -> None:
    """aiormq fails the futures pending on a channel it closes with a bare ``Exception``.

    Unmapped, it became an engine error that burned an attempt; it is a confirm that never
    came, so the report is held and tried again.
    """
    with pytest.raises(PublishError, match="its channel closed"), publish_errors("the report"):
        raise Exception
    with pytest.raises(TypeError), publish_errors("the report"):
        raise TypeError("a bug of ours stays a bug")
