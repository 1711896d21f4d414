"""An SDK task run as a seed 000 subprocess (``sfn.task_child.run_task``)."""

from async_task_api_worker.sfn.task_child import run_task
from tests.integration.sfn_sdk_workers import napper

if __name__ == "__main__":
    run_task(napper)
