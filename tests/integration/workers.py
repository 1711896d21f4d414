"""Workers the integration tests run as real processes (``tests.integration.workers:NAME``).

Each handler call writes a marker file into ``$ATW_TEST_MARKERS`` named
``<task_id>.<attempt>.<pid>.<run>``, so that a test can count calls and see their attempts
(``<run>`` is unique: RabbitMQ 4.3 hands one attempt out again after a give-back or a consumer
timeout, in the same process too).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from async_task_api_worker import FatalError, RetryableError, SyncTaskContext, TaskContext, Worker


class Input(BaseModel):
    """Any input."""

    seconds: float = 0.0


class Output(BaseModel):
    """What the handler saw."""

    attempt: int


def mark_started(ctx: TaskContext | SyncTaskContext) -> None:
    """Leave ``<task id>.<attempt>.<pid>.<run>`` in ``ATW_TEST_MARKERS``: this call started."""
    folder = Path(os.environ["ATW_TEST_MARKERS"])
    (folder / f"{ctx.task_id}.{ctx.attempt}.{os.getpid()}.{uuid.uuid4().hex[:8]}").touch()


class StrictInput(BaseModel):
    """An input that names its keys: a client's own key is an error (and must stay masked)."""

    model_config = ConfigDict(extra="forbid")

    seconds: float = 0.0


strict = Worker("strict")


@strict.task(timeout=60)
async def answer_strictly(task_input: StrictInput, ctx: TaskContext) -> Output:
    """Answer with the attempt."""
    return Output(attempt=ctx.attempt)


retrying = Worker("retrying")


@retrying.task(timeout=30)
async def always_retry(task_input: Input, ctx: TaskContext) -> Output:
    """Fail with a transient error, every time."""
    mark_started(ctx)
    raise RetryableError("UPSTREAM_DOWN", "The upstream is down.")


sleeping = Worker("sleeping")


@sleeping.task(timeout=600)
async def sleep_then_answer(task_input: Input, ctx: TaskContext) -> Output:
    """Sleep ``seconds``, then answer with the attempt (the first attempt may sleep longer)."""
    mark_started(ctx)
    await asyncio.sleep(task_input.seconds if ctx.attempt == 1 else 0.0)
    return Output(attempt=ctx.attempt)


hanging = Worker("hanging")


@hanging.task(timeout=600)
async def hang(task_input: Input, ctx: TaskContext) -> Output:
    """Never finish (until killed)."""
    mark_started(ctx)
    await asyncio.sleep(3600)
    return Output(attempt=ctx.attempt)


stuck = Worker("stuck")


@stuck.task(timeout=600)
def block(task_input: Input, ctx: SyncTaskContext) -> Output:
    """Block a thread for ten minutes: no drain can stop it."""
    mark_started(ctx)
    time.sleep(600)
    return Output(attempt=ctx.attempt)


offloading = Worker("offloading")


@offloading.task(timeout=600)
async def offload(task_input: Input, ctx: TaskContext) -> Output:
    """Block a thread started with asyncio.to_thread for ten minutes."""
    mark_started(ctx)
    await asyncio.to_thread(time.sleep, 600)
    return Output(attempt=ctx.attempt)


slow_start = Worker("slow-start")


@slow_start.on_startup
async def load_slowly() -> None:
    """A startup hook that takes an hour (a model download, say)."""
    await asyncio.sleep(3600)


@slow_start.task(timeout=5)
async def never_reached(task_input: Input, ctx: TaskContext) -> Output:
    """Not reached in the tests."""
    return Output(attempt=ctx.attempt)


failing_start = Worker("failing-start")


@failing_start.on_startup
async def cannot_load() -> None:
    """A startup hook that fails."""
    raise FileNotFoundError("model.bin")


@failing_start.task(timeout=5)
async def unreachable(task_input: Input, ctx: TaskContext) -> Output:
    """Not reached in the tests."""
    return Output(attempt=ctx.attempt)


def factory() -> Worker:
    """A factory target: ``tests.integration.workers:factory``."""
    return sleeping


pooled = Worker("pooled")


@pooled.readiness_probe(name="database")
async def database_of_this_process() -> bool:
    """Ready unless ``down-<pid>`` exists: one worker process of several can fail alone."""
    return not (Path(os.environ["ATW_TEST_MARKERS"]) / f"down-{os.getpid()}").exists()


@pooled.task(timeout=600)
async def pooled_sleep(task_input: Input, ctx: TaskContext) -> Output:
    """As ``sleeping``: sleep ``seconds`` on the first attempt, answer with the attempt."""
    mark_started(ctx)
    await asyncio.sleep(task_input.seconds if ctx.attempt == 1 else 0.0)
    return Output(attempt=ctx.attempt)


blocking_stop = Worker("blocking-stop")


@blocking_stop.on_shutdown
async def block_the_loop() -> None:
    """A shutdown hook that blocks the event loop: its timeout cannot stop it."""
    time.sleep(600)  # the point: nothing in the process can end it


@blocking_stop.task(timeout=5)
async def answer_at_once(task_input: Input, ctx: TaskContext) -> Output:
    """Answer with the attempt."""
    return Output(attempt=ctx.attempt)


class Choice(BaseModel):
    """What the ``mixed`` handler does: answer, fail for good, or fail for now."""

    outcome: str = "ok"


mixed = Worker("mixed")


@mixed.task(timeout=30)
async def do_as_told(task_input: Choice, ctx: TaskContext) -> Output:
    """Answer, raise a ``FatalError`` or a ``RetryableError``, as the input says."""
    mark_started(ctx)
    await asyncio.sleep(0.001 * (hash(ctx.task_id) % 20))  # out of order, as real work ends
    if task_input.outcome == "fail":
        raise FatalError("BAD_INPUT", "Told to fail.")
    if task_input.outcome == "retry":
        raise RetryableError("UPSTREAM_DOWN", "Told to retry.")
    return Output(attempt=ctx.attempt)
