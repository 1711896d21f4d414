"""The kit's setup the unit tests share: a worker named ``conformance`` with small limits."""

from __future__ import annotations

from async_task_api_worker.conformance.case import Setup

SETUP = Setup(
    service="conformance",
    delivery_limit=5,
    progress_interval_s=1.0,
    max_message_bytes=4096,
    run_id="r1",
)
