"""Running the worker's startup and shutdown hooks, and the shutdown bound they fit in.

Source: seed "Running a worker": startup hooks run before consuming (a failing one exits 1);
shutdown hooks get ``WORKER_SHUTDOWN_HOOKS_TIMEOUT_S`` in total, each what is left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from async_task_api_worker.engine.hold import PLACED_CONFIRM_WAIT_S
from async_task_api_worker.observability.redaction import exception_type_name, safe_traceback
from async_task_api_worker.settings import WorkerSettings, WorkerTransport
from async_task_api_worker.task_call import error_hooks

__all__ = [
    "CLOSE_TIMEOUT_S",
    "FINISH_MARGIN_S",
    "GIVE_BACK_TIMEOUT_S",
    "STOP_CONSUMING_MIN_S",
    "STUCK_CHECK_S",
    "StartupHookError",
    "close_timeout_s",
    "drain_grace_s",
    "run_shutdown_hooks",
    "run_startup_hooks",
    "shutdown_bound_s",
]

_logger = logging.getLogger("async_task_api_worker.runtime")

Hook = Callable[[], Awaitable[None]]

#: Time the in-flight deliveries get after the grace period, in seconds: a terminal report on
#: the wire waits for its confirm (``PLACED_CONFIRM_WAIT_S``), the others are given back.
GIVE_BACK_TIMEOUT_S: Final = PLACED_CONFIRM_WAIT_S + 3.0
#: Time the transport gets to close, in seconds.
CLOSE_TIMEOUT_S: Final = 5.0
#: Time stopping the consumer may take, even with a grace period shorter than this.
STOP_CONSUMING_MIN_S: Final = 5.0
#: Time a handler thread started with ``asyncio.to_thread`` gets after the drain.
STUCK_CHECK_S: Final = 2.0
#: Time past its timeout a task in hand gets on a transport that deletes on pickup (its
#: terminal report, the kill of its process group), in seconds.
FINISH_MARGIN_S: Final = 10.0


def drain_grace_s(settings: WorkerSettings, task_timeout_s: float) -> float:
    """The grace period in-flight tasks get after the signal, in seconds.

    ``WORKER_SHUTDOWN_GRACE_S``; on SQS + Step Functions (``WORKER_TRANSPORT=sqs-sfn``, which
    deletes a message on pickup) at least the task timeout plus :data:`FINISH_MARGIN_S`: a task
    in hand cannot be put back in a queue, so it is finished (seed 000: protection defers a
    stop until the message is done).
    """
    grace_s = settings.worker_shutdown_grace_s
    if settings.worker_transport is WorkerTransport.SQS_SFN:
        grace_s = max(grace_s, task_timeout_s + FINISH_MARGIN_S)
    return grace_s


def close_timeout_s(settings: WorkerSettings) -> float:
    """The time the transport gets to close, in seconds: :data:`CLOSE_TIMEOUT_S`.

    On SQS, plus ``SQS_WAIT_TIME_S``: a long poll in flight ends on its own, and what it brings
    goes back to the queue at once rather than after its visibility timeout.
    """
    poll_s = settings.sqs_wait_time_s if settings.worker_transport is WorkerTransport.SQS_SFN else 0
    return CLOSE_TIMEOUT_S + poll_s


def shutdown_bound_s(settings: WorkerSettings, *, grace_s: float | None = None) -> float:
    """The longest a shutdown takes from the signal to the process exit, in seconds.

    ``max(grace, 5) + 5 (nacks) + 5 (close) + WORKER_SHUTDOWN_HOOKS_TIMEOUT_S + 2 (stuck
    threads)``, the grace being ``WORKER_SHUTDOWN_GRACE_S`` unless :func:`drain_grace_s` says
    more (``grace_s``); on SQS, plus ``SQS_WAIT_TIME_S`` (a long poll in flight ends on its
    own). With the defaults on RabbitMQ, 25 + 17 = 42 s. A pod's
    ``terminationGracePeriodSeconds`` (an ECS container's ``stopTimeout``) must be at least this.
    """
    grace = settings.worker_shutdown_grace_s if grace_s is None else grace_s
    return (
        max(grace, STOP_CONSUMING_MIN_S)
        + GIVE_BACK_TIMEOUT_S
        + close_timeout_s(settings)
        + settings.worker_shutdown_hooks_timeout_s
        + STUCK_CHECK_S
    )


class StartupHookError(Exception):
    """An ``on_startup`` hook raised: the worker does not start (exit 1)."""


def _name(hook: Hook) -> str:
    return getattr(hook, "__qualname__", repr(hook))


async def run_startup_hooks(hooks: Sequence[Hook]) -> None:
    """Run the startup hooks in order.

    Raises:
        StartupHookError: a hook raised; its type is named, its message is not (it may hold a
            secret), the traceback's frames go to the log; at ``LOG_LEVEL=DEBUG`` the whole
            traceback too, messages included (URL passwords masked as in every line).
    """
    if hooks:
        _logger.info("Running %d startup hook(s)", len(hooks))
    for hook in hooks:
        try:
            await hook()
        except Exception as exc:
            _logger.error(
                "Startup hook %s raised %s\n%s",
                _name(hook),
                exception_type_name(exc),
                safe_traceback(exc),
            )
            # No task input is in hand yet: what the messages can hold is the deployment's own
            # configuration, which whoever sets DEBUG reads anyway.
            _logger.debug("Startup hook %s: the whole traceback", _name(hook), exc_info=exc)
            raise StartupHookError(
                f"startup hook {_name(hook)} raised {exception_type_name(exc)}"
            ) from exc


async def run_shutdown_hooks(hooks: Sequence[Hook], budget_s: float) -> None:
    """Run the shutdown hooks in order within ``budget_s`` seconds in total.

    Each hook gets what is left of the budget; one that overruns is cancelled, one that raises
    is logged; the next hooks still run (with what is left). The ``on_task_error`` hooks still
    busy get what is left after them (``task_call.error_hooks.drain``).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget_s
    for hook in hooks:
        remaining = deadline - loop.time()
        if remaining <= 0:
            _logger.warning("No time left for shutdown hook %s; skipped", _name(hook))
            continue
        try:
            await asyncio.wait_for(hook(), timeout=remaining)
        except TimeoutError:
            _logger.warning(
                "Shutdown hook %s ran out of time (%g s left of %g s); cancelled",
                _name(hook),
                remaining,
                budget_s,
            )
        except Exception as exc:
            _logger.error("Shutdown hook %s raised %s", _name(hook), exception_type_name(exc))
    # The on_task_error hooks still busy (a tracker's network call) share what is left: the
    # process must not wait for them past the shutdown bound as it exits.
    left = deadline - loop.time()
    if not await asyncio.to_thread(error_hooks.drain, max(0.0, left)):
        _logger.warning("The on_task_error hooks did not finish within the shutdown hooks' time")
