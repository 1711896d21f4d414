"""An SDK task run as a seed 000 subprocess (``sfn.task_child.run_task``)."""

from pydantic import BaseModel

from async_task_api_worker import FatalError, TaskContext, Worker
from async_task_api_worker.sfn.task_child import run_task


class Job(BaseModel):
    fail: bool = False


class Done(BaseModel):
    done: bool


worker = Worker("sdk-task")


@worker.task(timeout=30)
async def handle(job: Job, ctx: TaskContext) -> Done:
    if job.fail:
        raise FatalError("NOT_ALLOWED", "Not allowed for this account.")
    return Done(done=True)


if __name__ == "__main__":
    run_task(worker)
