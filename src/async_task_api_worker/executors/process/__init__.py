"""Process isolation: ``@worker.task(timeout=..., isolation="process")``."""

from async_task_api_worker.executors.process.executor import ProcessExecutor

__all__ = ["ProcessExecutor"]
