"""The engine: one delivery in, one settlement out (see :class:`Engine`)."""

from async_task_api_worker.engine.engine import UNKNOWN_COUNT_LIMIT, Engine, StopSignal

__all__ = ["UNKNOWN_COUNT_LIMIT", "Engine", "StopSignal"]
