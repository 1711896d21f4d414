"""What the kit's unit tests share: a worker named ``conformance`` with small limits, a report."""

from __future__ import annotations

from typing import Any

from async_task_api_worker.conformance.case import CLIENT_ID, Setup
from async_task_api_worker.conformance.report_rules import Seen, read_json
from async_task_api_worker.protocol.encoding import canonical_dumps

SETUP = Setup(
    service="conformance",
    delivery_limit=5,
    progress_interval_s=1.0,
    max_message_bytes=4096,
    run_id="r1",
)


def report(
    kind: str = "started",
    *,
    task_id: str = "cf-r1-case-1",
    seq: int = 0,
    at: str = "2026-11-29T22:48:46.000001Z",
    **fields: Any,
) -> Seen:
    """A canonical report of ``task_id`` as the kit reads it (``fields`` replace or add)."""
    document: dict[str, Any] = {
        "protocol_version": 1,
        "type": kind,
        "task_id": task_id,
        "client_id": CLIENT_ID,
        "service": "conformance",
        "attempt": 1,
        "timestamp": at,
    }
    document.update(fields)
    body = canonical_dumps(document)
    message_id = f"{document['task_id']}/{document['attempt']}/{seq}"
    return Seen(body, read_json(body), {"message_id": message_id}, 0.0)
