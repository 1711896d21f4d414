"""Detached workers: work that outlives its tick, results that are never silently lost.

Seed 002's pattern, usable from any budgeted, at-least-once consumer (a cron job, a scheduled
Kubernetes Job, a handler that must return in seconds):

- :func:`spawn_detached` hands a message to a worker in a new session, after writing an
  in-flight marker (the durable receipt);
- the worker writes one result file per correlation id, success or failure;
- :func:`sweep`, at the start of every tick, delivers the finished results and turns each
  marker past its deadline into one explicit error result;
- :func:`in_flight` says whether work is mid-flight (skip a health check meanwhile).

``docs/detached.md`` has the budget arithmetic and deployment examples.
"""

from async_task_api_worker.detached.marker import Marker
from async_task_api_worker.detached.spawn import spawn_detached
from async_task_api_worker.detached.sweep import SweepReport, Undeliverable, in_flight, sweep

__all__ = ["Marker", "SweepReport", "Undeliverable", "in_flight", "spawn_detached", "sweep"]
