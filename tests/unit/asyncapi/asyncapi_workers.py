"""Workers for the AsyncAPI tests: models whose JSON Schema needs rewriting, or has none."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field

from async_task_api_worker import TaskContext, Worker


class Item(BaseModel):
    """A nested model."""

    name: str


class Cat(BaseModel):
    kind: Literal["cat"] = "cat"


class Dog(BaseModel):
    kind: Literal["dog"] = "dog"


class Envelope(BaseModel):
    """A task model that takes a protocol schema's name."""

    items: list[Item]
    pair: tuple[int, str]
    pet: Cat | Dog = Field(discriminator="kind")
    extra: dict[str, Any] = Field(default={"$ref": "#/$defs/kept", "discriminator": {"a": 1}})


rich = Worker("rich")


@rich.task(timeout=5, errors={"INVALID_INPUT": "the items are empty", "GONE": "it is gone"})
async def rich_handler(task_input: Envelope, ctx: TaskContext) -> Item:
    return task_input.items[0]


class Unschemable(BaseModel):
    call: Callable[[], None]


unschemable = Worker("unschemable")


@unschemable.task(timeout=5)
async def unschemable_handler(task_input: Unschemable, ctx: TaskContext) -> Item:
    return Item(name="x")
