"""Checked by mypy (strict), never run: the public API's types, as a user sees them."""

from typing import assert_type

from pydantic import BaseModel

from async_task_api_worker import SyncTaskContext, TaskContext, Worker
from async_task_api_worker.testing import Outcome, TaskRun, WorkerHarness, make_task_context


class In(BaseModel):
    text: str


class Out(BaseModel):
    words: int


worker = Worker("count-words")


@worker.task(timeout=30.0)
async def handle(task_input: In, ctx: TaskContext) -> Out:
    await ctx.progress(0.5)
    return Out(words=1)


@Worker("sync").task(timeout=1, errors={"EMPTY_TEXT": "the text is blank"})
def handle_sync(task_input: In, ctx: SyncTaskContext) -> Out:
    ctx.progress(0.5, {"stage": "x"})
    return Out(words=1)


async def typed_usage() -> None:
    # The decorator keeps the handler's own signature, so it can be called directly.
    assert_type(await handle(In(text="a"), make_task_context()), Out)
    async with WorkerHarness(worker) as harness:
        run = await harness.submit({"text": "a"})
    assert_type(run, TaskRun)
    assert_type(run.outcome, Outcome)
    assert_type(run.message_types, tuple[str, ...])
    await handle("not a model", make_task_context())  # type: ignore[arg-type]
    handle_sync(In(text="a"), make_task_context())  # type: ignore[arg-type]
