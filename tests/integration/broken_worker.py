"""A module whose worker definition is wrong: importing it raises a DefinitionError."""

from pydantic import BaseModel

from async_task_api_worker import SyncTaskContext, Worker


class Model(BaseModel):
    """Any model."""


worker = Worker("broken")


@worker.task(timeout=5)
async def handle(task_input: Model, ctx: SyncTaskContext) -> Model:  # wrong context class
    """Never registered."""
    return task_input
