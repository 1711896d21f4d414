"""Loading ``module:attribute`` into a Worker (kept where the commands look for it)."""

from async_task_api_worker.targets import load_worker

__all__ = ["load_worker"]
