"""Shared test helpers: decision lines from captured logs; xdist groups; the fault table."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

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


# ---------------------------------------------------------------- running in parallel (xdist)

#: Tests that run on one xdist worker, one after another, never beside each other: each group
#: is one unit of work for the scheduler (``--dist loadgroup``, below). Everything else is spread
#: test by test: each worker has vhosts of its own, and every port and node name is a free one
#: (tests/ports.py).
XDIST_GROUPS = {
    # The fault suite: its rows measure seconds, and must not share the machine with each
    # other's nodes and injected load.
    "tests/faults/": "faults",
    # Its module fixture runs every kit run at once (it would run once per worker otherwise).
    "tests/conformance/test_kit_on_rabbitmq.py": "conformance-kit",
    # Node boots and a three-node cluster: heavy for two cores.
    "tests/integration/test_rabbitmq_nodes.py": "rabbitmq-nodes",
    # Its module fixture starts one TLS node for all its cases (one per worker otherwise).
    "tests/integration/test_tls_on_rabbitmq.py": "tls",
    # One npm ci (a session fixture) for all of them, not one per worker.
    "tests/js/": "js-tools",
    # One build of the site for the strict check and the browser's pages.
    "tests/docs/test_site.py": "docs-site",
}


def xdist_group_of(nodeid: str) -> str | None:
    """The group of the test ``nodeid`` (relative to the repository), or None."""
    return next((group for place, group in XDIST_GROUPS.items() if nodeid.startswith(place)), None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``, with the groups of ``XDIST_GROUPS`` (by path).

    xdist's own loadgroup reads ``xdist_group`` marks by renaming the items' node ids, which
    pytest 9 no longer lets it do: the groups are told by path instead, on the controller.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class PathGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid) or super()._split_scope(nodeid)

    return PathGroupScheduling(config, log)


# ---------------------------------------------------------------- the fault table

#: The user property a fault case's row travels in, from the worker that ran it.
FAULT_ROW = "fault_row"
FAULT_ROWS: list[dict[str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        FAULT_ROWS.extend(value for name, value in report.user_properties if name == FAULT_ROW)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FAULT_ROWS:
        return
    terminalreporter.write_sep("-", "fault table (per task id)")
    for line in fault_table(FAULT_ROWS):
        terminalreporter.write_line(line)
    destination = os.environ.get("ATW_FAULT_TABLE")
    if destination:
        with Path(destination).open("w") as out:
            for row in FAULT_ROWS:
                out.write(json.dumps(row) + "\n")


def fault_table(rows: list[dict[str, Any]]) -> list[str]:
    """The fault table as Markdown lines."""
    lines = [
        "| fault | broker | tasks | lost | duplicate successes | double conclusions | hung "
        "| handler runs | reports | measured |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        codes = ", ".join(f"{code} {n}" for code, n in dict(row["codes"]).items())
        lines.append(
            f"| {row['case']} | {row.get('broker', '')} | {row['tasks']} | {row['lost']} "
            f"| {row['duplicate_successes']} | {row['double_conclusions']} | {row['hung']} "
            f"| {row['handler_runs']} | {codes} | {row.get('measured', '')} |"
        )
    return lines
