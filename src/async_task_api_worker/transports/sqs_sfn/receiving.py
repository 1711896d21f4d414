"""The receive side of the SQS + Step Functions transport: long polls, and hand-backs.

A message received is not yet the worker's: until it is deleted (at pickup, under protection)
it comes back to the queue by itself once its visibility timeout runs out. What a stop leaves
over (a batch not picked up, a poll that answers after the stop) is handed back at once, its
visibility set to 0, so that another worker takes it without waiting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from async_task_api_worker.errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    SettleError,
    TransportError,
)
from async_task_api_worker.transports.sqs_sfn.aws import QueueRefusedError, SqsApi

__all__ = ["CONNECT_BACKOFF_MAX_S", "RECEIVE_BACKOFF_S", "Receiver", "delete", "reach"]

_logger = logging.getLogger("async_task_api_worker.transports.sqs_sfn")

#: The wait after a failed receive (or an empty one without a long poll), in seconds.
RECEIVE_BACKOFF_S: Final = 1.0
#: The longest wait between two tries to reach SQS at start, in seconds.
CONNECT_BACKOFF_MAX_S: Final = 30.0
#: While receives keep failing, one line per this many seconds.
FAILURE_LOG_EVERY_S: Final = 60.0

Message = Mapping[str, Any]


class Receiver:
    """Long polls for one queue.

    Args:
        sqs: the queue's API.
        pool: where the blocking calls run.
        wait_s: the long poll, in seconds.
        stopped: set when the transport stops; it cuts every wait short.
    """

    def __init__(
        self,
        sqs: SqsApi,
        pool: concurrent.futures.Executor,
        wait_s: int,
        stopped: asyncio.Event,
    ) -> None:
        self._sqs = sqs
        self._pool = pool
        self._wait_s = wait_s
        self._stopped = stopped
        self.ok = True
        """Whether the last receive went through (readiness)."""
        self._failures = 0
        self._logged_at: float | None = None
        self._in_flight: asyncio.Future[list[Message]] | None = None
        self._handing_back: list[concurrent.futures.Future[Any]] = []

    async def receive(self, free: int) -> list[Message]:
        """Up to ``free`` messages (at most 10); none after a failure, once its backoff is over.

        Raises:
            QueueRefusedError: SQS refuses the queue for good (deleted, rights lost).
        """
        loop = asyncio.get_running_loop()
        receiving = loop.run_in_executor(
            self._pool, functools.partial(self._sqs.receive, free, self._wait_s)
        )
        self._in_flight = receiving
        try:
            messages = await asyncio.shield(receiving)
        except asyncio.CancelledError:
            # The poll cannot be stopped half-way: what it brings is handed back, not lost.
            receiving.add_done_callback(self._hand_back_when_done)
            raise
        except QueueRefusedError:
            raise
        except TransportError as exc:
            self._failed(exc, loop.time())
            await self._pause()
            return []
        finally:
            if receiving.done():
                self._in_flight = None
        if not self.ok:
            _logger.info("Receiving from SQS works again (after %d failures)", self._failures)
        self.ok, self._failures, self._logged_at = True, 0, None
        if not messages and self._wait_s == 0:
            await self._pause()  # no long poll: an empty queue would be asked again at once
        return messages

    def _failed(self, exc: TransportError, now: float) -> None:
        self.ok = False
        self._failures += 1
        if self._logged_at is None or now - self._logged_at >= FAILURE_LOG_EVERY_S:
            self._logged_at = now
            _logger.warning(
                "%s; trying again every %g s (%d so far)", exc, RECEIVE_BACKOFF_S, self._failures
            )

    async def _pause(self) -> None:
        with contextlib.suppress(TimeoutError):  # a stop cuts the wait short
            await asyncio.wait_for(self._stopped.wait(), RECEIVE_BACKOFF_S)

    async def hand_back(self, messages: Sequence[Message]) -> None:
        """Make ``messages`` visible again at once (best effort: they come back anyway)."""
        for message in messages:
            with contextlib.suppress(SettleError, RuntimeError):
                await asyncio.get_running_loop().run_in_executor(
                    self._pool,
                    functools.partial(
                        self._sqs.make_visible, str(message.get("ReceiptHandle", ""))
                    ),
                )

    def _hand_back_when_done(self, receiving: asyncio.Future[list[Message]]) -> None:
        if receiving.cancelled() or receiving.exception() is not None:
            return
        for message in receiving.result():
            with contextlib.suppress(RuntimeError):  # the pool is gone: SQS brings it back
                self._handing_back.append(self._pool.submit(self._hand_back_now, message))

    def _hand_back_now(self, message: Message) -> None:
        with contextlib.suppress(SettleError):
            self._sqs.make_visible(str(message.get("ReceiptHandle", "")))

    async def finish(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a poll in flight, so that its messages go back now."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        receiving = self._in_flight
        if receiving is not None and not receiving.done():
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(receiving), timeout_s)
            await asyncio.sleep(0)  # its done callback queues the hand-backs
        pending = [asyncio.wrap_future(future) for future in self._handing_back]
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()))


async def delete(
    call: Callable[[Callable[[], Any]], Awaitable[Any]],
    sqs: SqsApi,
    receipt: str,
    message_id: str,
    *,
    again: bool = False,
) -> bool:
    """Delete a message through ``call`` (the transport's pool).

    Returns ``False`` (logged) when it did not go through for now. ``again``: a retry, logged
    at DEBUG (the first failure said it at WARNING).

    Raises:
        QueueRefusedError: SQS refuses deletes for good.
    """
    try:
        await call(functools.partial(sqs.delete, receipt))
    except SettleError as exc:
        _logger.log(
            logging.DEBUG if again else logging.WARNING,
            "Could not delete the message (%s); trying again with each heartbeat",
            exc,
            extra={"task_id": message_id},
        )
        return False
    return True


async def reach(
    call: Callable[[Callable[[], Any]], Awaitable[Any]],
    sqs: SqsApi,
    queue_url: str,
    timeout_s: float | None,
) -> None:
    """Check the queue through ``call``, trying again with a backoff capped at 30 s.

    Raises:
        BrokerRefusedError: the queue does not exist, or AWS refuses the credentials.
        BrokerUnavailableError: SQS could not be reached within ``timeout_s`` (``None``:
            keep trying).
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    delay_s = 1.0
    while True:
        try:
            await call(sqs.check)
        except BrokerRefusedError:
            raise
        except TransportError as exc:
            if timeout_s is not None and loop.time() - started >= timeout_s:
                raise BrokerUnavailableError(
                    f"SQS could not be reached within {timeout_s:g} s ({exc})"
                ) from exc
            _logger.warning("%s (SQS_QUEUE_URL %s); trying again in %g s", exc, queue_url, delay_s)
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, CONNECT_BACKOFF_MAX_S)
            continue
        return
