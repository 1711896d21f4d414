"""A worker whose models bait code generators: names of the protocol's and of Modelina's own.

Its input model is named ``Envelope`` (the protocol's envelope) and its output ``Output``
(Modelina's name for the union of the output channel's reports); they hold a nested model, a
tuple, a discriminated union and an integer literal (a ``const`` that is not a string). The
nested models are the AsyncAPI unit tests' own.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from async_task_api_worker import TaskContext, Worker
from tests.unit.asyncapi.asyncapi_workers import Cat, Dog, Item


class Envelope(BaseModel):
    """A task input named as the protocol's envelope."""

    items: list[Item]
    pair: tuple[int, str]
    pet: Cat | Dog = Field(discriminator="kind")
    level: Literal[3] = 3


class Output(BaseModel):
    """A task output named as Modelina's union of the output channel's messages."""

    first: Item
    count: int


worker = Worker("codegen")


@worker.task(timeout=5)
async def handle(task_input: Envelope, ctx: TaskContext) -> Output:
    return Output(first=task_input.items[0], count=len(task_input.items))
