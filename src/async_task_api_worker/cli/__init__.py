"""The ``async-task-api-worker`` command: ``run``, ``dev`` and ``submit``."""

from async_task_api_worker.cli.main import main

__all__ = ["main"]
