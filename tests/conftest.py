"""Shared test helpers: decision lines from captured logs."""

from __future__ import annotations

import logging

import pytest

DECISION_PREFIX = "Delivery settled:"


def decision_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The engine's decision lines among the captured records."""
    return [
        record
        for record in caplog.records
        if record.name == "async_task_api_worker.engine"
        and record.getMessage().startswith(DECISION_PREFIX)
    ]


@pytest.fixture
def decisions(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Capture INFO records of the SDK, for the decision lines."""
    caplog.set_level(logging.INFO, logger="async_task_api_worker")
    return caplog
