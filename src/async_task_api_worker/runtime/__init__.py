"""The runtime: the runner's lifecycle, signals, exit codes."""

from async_task_api_worker.runtime.exit_codes import ExitCode
from async_task_api_worker.runtime.runner import Runner, RunnerState

__all__ = ["ExitCode", "Runner", "RunnerState"]
