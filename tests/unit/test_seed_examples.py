"""The seed's "Testing your worker" example, written exactly as a user would write it."""

from pydantic import BaseModel

from async_task_api_worker import FatalError, TaskContext, Worker
from async_task_api_worker.testing import (
    Outcome,
    ProgressRecorder,
    WorkerHarness,
    make_task_context,
)


class Input(BaseModel):
    text: str


class Output(BaseModel):
    words: int


worker = Worker("count-words")


@worker.task(timeout=30.0)
async def handle(task_input: Input, ctx: TaskContext) -> Output:
    if not task_input.text.strip():
        raise FatalError("EMPTY_TEXT", "There is nothing to count.")
    await ctx.progress(0.5)
    return Output(words=len(task_input.text.split()))


async def test_counts_the_words() -> None:
    async with WorkerHarness(worker) as harness:
        run = await harness.submit({"text": "hello big world"})

    run.assert_succeeded()
    assert run.response == {"words": 3}
    assert run.message_types == ("started", "progress", "success")


async def test_an_empty_text_fails_with_its_code() -> None:
    async with WorkerHarness(worker) as harness:
        run = await harness.submit({"text": "  "})

    run.assert_failed(code="EMPTY_TEXT")
    assert run.outcome is Outcome.ACKED


async def test_the_handler_alone_with_a_context_you_build() -> None:
    recorder = ProgressRecorder()
    ctx = make_task_context(recorder=recorder)

    assert await handle(Input(text="a b"), ctx) == Output(words=2)
    assert [update.fraction for update in recorder.updates] == [0.5]
