"""The README's example worker: count the words of a text.

Try it with no broker::

    uv run async-task-api-worker dev examples.count_words:worker examples/count_words.jsonl

or on RabbitMQ (``run`` in one terminal, ``submit`` in another)::

    uv run async-task-api-worker run examples.count_words:worker
    uv run async-task-api-worker submit '{"text": "hello big world"}' --service count-words
"""

from pydantic import BaseModel, Field

from async_task_api_worker import FatalError, TaskContext, Worker


class Input(BaseModel):
    """The task input: a text of 1 to 100,000 characters."""

    text: str = Field(min_length=1, max_length=100_000)


class Output(BaseModel):
    """The response: how many words."""

    words: int


worker = Worker("count-words")


@worker.task(timeout=30.0, errors={"EMPTY_TEXT": "the text holds nothing to count"})
async def handle(task_input: Input, ctx: TaskContext) -> Output:
    """Count the words; an all-blank text fails with EMPTY_TEXT."""
    if not task_input.text.strip():
        raise FatalError("EMPTY_TEXT", "There is nothing to count.")
    await ctx.progress(0.5)
    return Output(words=len(task_input.text.split()))
