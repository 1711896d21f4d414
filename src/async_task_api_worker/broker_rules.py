"""The broker's rules over the settings: the broker URLs, the time budget, and the lease.

``async_task_api_worker.settings`` validates ``BROKER_URL`` with :func:`split_broker_urls`;
the RabbitMQ transport asks for :func:`consumer_timeout_s` where the broker takes it, and
raises the budget rule's error (:func:`check_time_budget`) where it does not; ``check`` prints
both; the engine holds a report until :func:`consumer_timeout_s` nears. A process-isolated
task's lease (``ports.Lease``) expires after :func:`lease_expiry_s`, the heartbeats after which
the broker takes a silent worker for dead.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Final

from async_task_api_worker.errors import TimeBudgetError

if TYPE_CHECKING:
    from async_task_api_worker.settings import WorkerSettings

__all__ = [
    "AMQP_PORTS",
    "CANCEL_GRACE_S",
    "RABBITMQ_4_3",
    "PLACED_CONFIRM_WAIT_S",
    "SILENT_HEARTBEATS_TO_DEAD",
    "TLS_QUERY_OPTIONS",
    "check_time_budget",
    "consumer_timeout_s",
    "delivery_budget_s",
    "describe_time_budget",
    "heartbeat_in_force_s",
    "lease_expiry_s",
    "split_broker_urls",
    "since_rabbitmq_4_3",
]

#: A broker connection silent for this many heartbeats is taken for dead (and one silent for a
#: whole heartbeat is not ready); RabbitMQ sends a frame at least every half heartbeat. A
#: process-isolated task's lease expires after as many (:func:`lease_expiry_s`).
SILENT_HEARTBEATS_TO_DEAD: Final = 2

#: The schemes ``BROKER_URL`` accepts, and their default ports.
AMQP_PORTS: Final = {"amqp": 5672, "amqps": 5671}
#: The TLS options of an ``amqps://`` URL (``transports.rabbitmq.tls.tls_context``): aiormq's
#: names, and RabbitMQ's URI query parameter for the server name (docs/tls.md).
TLS_QUERY_OPTIONS: Final = (
    "cafile",
    "capath",
    "cadata",
    "certfile",
    "keyfile",
    "no_verify_ssl",
    "server_name_indication",
)
#: The Erlang client's names of TLS options, which this client does not read, and its own.
_OTHER_CLIENTS_OPTIONS: Final = {"cacertfile": "cafile", "verify": "no_verify_ssl"}
#: Every query option the broker clients read (aiormq: ``heartbeat``, ``timeout``, ``name``,
#: ``auth``; aio-pika: the rest), TLS's included: any other one would be ignored in silence,
#: and a misspelt ``certfle`` would turn mutual TLS off without a word.
URL_QUERY_OPTIONS: Final = frozenset(
    {
        *TLS_QUERY_OPTIONS,
        *("heartbeat", "timeout", "name", "auth"),
        *("interleave", "happy_eyeballs_delay", "reconnect_interval", "fail_fast"),
    }
)


def split_broker_urls(value: str) -> tuple[str, ...]:
    """Split ``BROKER_URL`` at its commas and check each URL.

    Rule: each is ``amqp://`` or ``amqps://``, names a host, and any port is in 1..65535;
    its query options are ones the clients read (:data:`URL_QUERY_OPTIONS`); only an
    ``amqps://`` URL takes TLS options (:data:`TLS_QUERY_OPTIONS`), under this client's names
    (``cafile``, not the Erlang client's ``cacertfile``).

    Returns:
        The URLs, stripped of surrounding white space, in the order given.

    Raises:
        ValueError: a URL breaks the rule; the message names its position, never its text.
    """
    from difflib import get_close_matches
    from urllib.parse import parse_qs, urlsplit

    urls = tuple(part.strip() for part in value.split(","))
    for position, url in enumerate(urls, start=1):
        which = f"URL {position} of {len(urls)}" if len(urls) > 1 else "the URL"
        if not url:
            raise ValueError(f"{which} is empty (a comma too many?)")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise ValueError(
                f"{which} has a port out of 1..65535 or does not parse (a comma, @, : or / in "
                "a user name or password must be percent-encoded)"
            ) from None
        if any(character.isspace() for character in url):
            raise ValueError(f"{which} holds white space (separate several URLs with commas)")
        if parts.scheme not in AMQP_PORTS:
            raise ValueError(f"{which} must be an amqp:// or amqps:// URL")
        if not parts.hostname:
            raise ValueError(f"{which} names no host")
        if port == 0:
            raise ValueError(f"{which} has a port out of 1..65535")
        options = parse_qs(parts.query, keep_blank_values=True)
        for other, ours in _OTHER_CLIENTS_OPTIONS.items():
            if other in options:
                raise ValueError(f"{which} has ?{other}=, which this client reads as ?{ours}=")
        for name in sorted(options.keys() - URL_QUERY_OPTIONS):
            like = get_close_matches(name, URL_QUERY_OPTIONS, n=1)
            hint = f" (did you mean ?{like[0]}=?)" if like else ""
            raise ValueError(f"{which} has ?{name}=, an option no client reads{hint}")
        tls = [name for name in TLS_QUERY_OPTIONS if name in options]
        if tls and parts.scheme != "amqps":
            raise ValueError(
                f"{which} gives TLS options ({', '.join(tls)}) but is amqp://: use amqps://"
            )
    return urls


def heartbeat_in_force_s(url: str, heartbeat_s: int) -> int:
    """The AMQP heartbeat of a connection to ``url``, in whole seconds (0: none).

    The URL's own ``?heartbeat=`` wins over ``heartbeat_s`` (``BROKER_HEARTBEAT_S``), read as
    aiormq reads it: an integer from 0 to 65534, anything else 0.
    """
    from urllib.parse import parse_qs, urlsplit

    values = parse_qs(urlsplit(url).query, keep_blank_values=True).get("heartbeat")
    if not values:
        return heartbeat_s
    try:
        value = int(values[0])
    except ValueError:
        return 0
    return value if 0 <= value < 65535 else 0


def lease_expiry_s(settings: WorkerSettings) -> float | None:
    """Seconds a process-isolated task runs on without its lease renewed: the fencing bound.

    Rule: :data:`SILENT_HEARTBEATS_TO_DEAD` heartbeats, the time after which a silent worker
    is taken for dead. On RabbitMQ the heartbeat in force (:func:`heartbeat_in_force_s`; the
    longest of several URLs'); on SQS + Step Functions ``SFN_HEARTBEAT_INTERVAL_S``, the
    worker's heartbeat of a task token. ``None`` (no lease) when every URL turns heartbeats
    off (``?heartbeat=0``): the broker then never takes a silent worker for dead.
    """
    from async_task_api_worker.settings import WorkerTransport

    if settings.worker_transport is WorkerTransport.SQS_SFN:
        return SILENT_HEARTBEATS_TO_DEAD * settings.sfn_heartbeat_interval_s
    heartbeat_s = max(
        heartbeat_in_force_s(url, settings.broker_heartbeat_s) for url in settings.broker_urls()
    )
    return float(SILENT_HEARTBEATS_TO_DEAD * heartbeat_s) if heartbeat_s else None


#: Seconds an ``async def`` handler that ignores its cancel gets past its timeout before the
#: worker concludes ``TASK_TIMEOUT`` without it (``executors.inline``).
CANCEL_GRACE_S: Final = 1.0
#: Seconds a terminal report already on the wire waits for its confirm before its delivery may
#: be given back (``engine.hold``): the broker has it, or is about to.
PLACED_CONFIRM_WAIT_S: Final = 2.0
#: The RabbitMQ version whose counting and consumer timeouts differ (:func:`since_rabbitmq_4_3`).
RABBITMQ_4_3: Final = (4, 3)


def delivery_budget_s(settings: WorkerSettings, timeout_s: float) -> float:
    """The longest a delivery can take from its arrival to its settle, the broker willing.

    ``timeout_s + WORKER_RETRY_BACKOFF_MAX_S + CANCEL_GRACE_S + PLACED_CONFIRM_WAIT_S``: the
    task runs to its timeout (a ``RetryableError`` then waits its backoff), a handler that
    ignores its cancel is waited for, and the terminal report waits for its confirm.

    Args:
        settings: the worker's settings.
        timeout_s: the effective task timeout (``WorkerSettings.task_timeout_s``), in seconds.
    """
    return timeout_s + settings.worker_retry_backoff_max_s + CANCEL_GRACE_S + PLACED_CONFIRM_WAIT_S


def consumer_timeout_s(settings: WorkerSettings, timeout_s: float) -> float:
    """The consumer timeout a delivery of this task lives under, in seconds.

    ``WORKER_CONSUMER_TIMEOUT_S`` when the budget fits under it (:func:`check_time_budget`);
    else the budget plus ``WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S``, rounded up, plus 1 s:
    the timeout the worker asks for itself where the broker takes one
    (:func:`since_rabbitmq_4_3`; elsewhere the worker does not start).
    """
    needed_s = delivery_budget_s(settings, timeout_s) + (
        settings.worker_consumer_timeout_check_interval_s
    )
    if needed_s < settings.worker_consumer_timeout_s or not math.isfinite(needed_s):
        return settings.worker_consumer_timeout_s
    return float(math.ceil(needed_s) + 1)


def since_rabbitmq_4_3(server_version: object) -> bool:
    """Whether a RabbitMQ of ``server_version`` is 4.3 or later.

    ``server_version`` is ``connection.start``'s ``version`` (``"4.3.6"``, text or bytes). From
    4.3 a quorum queue takes a consumer's own timeout (``x-consumer-timeout``), sets
    ``x-acquired-count`` and counts no give-back (``basic.nack``) in ``x-delivery-count``; a
    classic queue has no consumer timeout. An unreadable version is taken for an older one.
    """
    text = (
        server_version.decode("ascii", "replace")
        if isinstance(server_version, bytes)
        else str(server_version)
    )
    numbers = tuple(int(part) for part in re.findall(r"[0-9]+", text)[:2])
    return len(numbers) == 2 and numbers >= RABBITMQ_4_3


def check_time_budget(settings: WorkerSettings, declared_timeout_s: float) -> float:
    """Check that a task can always be settled before the broker's own consumer timeout.

    For a RabbitMQ that sets no timeout of a consumer's asking (before 4.3): it closes the
    channel of a delivery left unacked past ``consumer_timeout``, checked on its channel tick.
    Rule: ``delivery_budget_s + WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S <
    WORKER_CONSUMER_TIMEOUT_S``. RabbitMQ 4.3 and later takes the worker's own
    (:func:`consumer_timeout_s`), and the rule is not needed.

    Args:
        settings: the worker's settings.
        declared_timeout_s: the ``@worker.task(timeout=...)`` value, in seconds.

    Returns:
        The effective task timeout, in seconds.

    Raises:
        TimeBudgetError: the rule does not hold; the one-line message gives the numbers.
    """
    timeout_s = settings.task_timeout_s(declared_timeout_s)
    if consumer_timeout_s(settings, timeout_s) != settings.worker_consumer_timeout_s:
        raise TimeBudgetError(
            f"{describe_time_budget(settings, timeout_s)} must be under "
            f"WORKER_CONSUMER_TIMEOUT_S {settings.worker_consumer_timeout_s:g} s on RabbitMQ "
            "before 4.3: lower the task timeout or WORKER_RETRY_BACKOFF_MAX_S, or raise the "
            "broker's consumer_timeout (rabbitmq.conf, in ms) and WORKER_CONSUMER_TIMEOUT_S to "
            "match, or use RabbitMQ 4.3+ with a quorum queue (the worker sets its own); a broker "
            "that checks it more often (channel_tick_interval) allows a lower "
            "WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S"
        )
    return timeout_s


def describe_time_budget(settings: WorkerSettings, timeout_s: float) -> str:
    """The budget's sum in words: ``task timeout 30 s + ... = 120 s`` (for errors and ``check``)."""
    backoff_s = settings.worker_retry_backoff_max_s
    check_s = settings.worker_consumer_timeout_check_interval_s
    total_s = delivery_budget_s(settings, timeout_s) + check_s
    return (
        f"task timeout {timeout_s:g} s + WORKER_RETRY_BACKOFF_MAX_S {backoff_s:g} s + cancel "
        f"grace {CANCEL_GRACE_S:g} s + report confirm {PLACED_CONFIRM_WAIT_S:g} s + "
        f"WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S {check_s:g} s = {total_s:g} s"
    )
