"""RabbitMQ's rules over the settings: the shape of the broker URLs, and the time budget.

``async_task_api_worker.settings`` validates ``BROKER_URL`` with :func:`split_broker_urls` and
re-exports all three functions; ``runtime.entry`` checks the budget at startup, ``check``
prints it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

from async_task_api_worker.errors import TimeBudgetError

if TYPE_CHECKING:
    from async_task_api_worker.settings import WorkerSettings

__all__ = ["check_time_budget", "describe_time_budget", "split_broker_urls"]

#: The schemes ``BROKER_URL`` accepts, and their default ports.
_AMQP_PORTS: Final = {"amqp": 5672, "amqps": 5671}


def split_broker_urls(value: str) -> tuple[str, ...]:
    """Split ``BROKER_URL`` at its commas and check each URL.

    Rule: each is ``amqp://`` or ``amqps://``, names a host, and any port is in 1..65535.

    Returns:
        The URLs, stripped of surrounding white space, in the order given.

    Raises:
        ValueError: a URL breaks the rule; the message names its position, never its text.
    """
    from urllib.parse import urlsplit

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
        if parts.scheme not in _AMQP_PORTS:
            raise ValueError(f"{which} must be an amqp:// or amqps:// URL")
        if not parts.hostname:
            raise ValueError(f"{which} names no host")
        if port == 0:
            raise ValueError(f"{which} has a port out of 1..65535")
    return urls


def check_time_budget(settings: WorkerSettings, declared_timeout_s: float) -> float:
    """Check that a task can always be settled before the broker's consumer timeout.

    Rule (RabbitMQ closes the channel of a delivery left unacked past ``consumer_timeout``,
    checked on its channel tick): ``task timeout + WORKER_RETRY_BACKOFF_MAX_S +
    WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S < WORKER_CONSUMER_TIMEOUT_S``.

    Args:
        settings: the worker's settings.
        declared_timeout_s: the ``@worker.task(timeout=...)`` value, in seconds.

    Returns:
        The effective task timeout, in seconds.

    Raises:
        TimeBudgetError: the rule does not hold; the one-line message gives the numbers.
    """
    timeout_s = settings.task_timeout_s(declared_timeout_s)
    check_s = settings.worker_consumer_timeout_check_interval_s
    needed_s = timeout_s + settings.worker_retry_backoff_max_s + check_s
    if not needed_s < settings.worker_consumer_timeout_s or not math.isfinite(needed_s):
        raise TimeBudgetError(
            f"{describe_time_budget(settings, timeout_s)} must be under "
            f"WORKER_CONSUMER_TIMEOUT_S {settings.worker_consumer_timeout_s:g} s: lower the task "
            "timeout or WORKER_RETRY_BACKOFF_MAX_S, or raise the broker's consumer_timeout "
            "(rabbitmq.conf, in ms) and WORKER_CONSUMER_TIMEOUT_S to match; a broker that checks "
            "it more often (channel_tick_interval) allows a lower "
            "WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S"
        )
    return timeout_s


def describe_time_budget(settings: WorkerSettings, timeout_s: float) -> str:
    """The budget's sum in words: ``task timeout 30 s + ... = 120 s`` (for errors and ``check``)."""
    backoff_s = settings.worker_retry_backoff_max_s
    check_s = settings.worker_consumer_timeout_check_interval_s
    return (
        f"task timeout {timeout_s:g} s + WORKER_RETRY_BACKOFF_MAX_S {backoff_s:g} s + "
        f"WORKER_CONSUMER_TIMEOUT_CHECK_INTERVAL_S {check_s:g} s = "
        f"{timeout_s + backoff_s + check_s:g} s"
    )
