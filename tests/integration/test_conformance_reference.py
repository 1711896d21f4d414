"""This SDK's reference worker passes the conformance kit, strict, with its cancels.

``examples/conformance_worker.py`` serves the kit's reference task with the default settings;
the kit (``conformance --strict --with cancel``) runs every case against it through the broker
of the run, so that CI checks the kit and the worker on each RabbitMQ version it runs (the
kit's own defects are found by tests/conformance/, on the machine's broker).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.kit_runs import ALL_CASES, run_kit, start_subject

pytestmark = pytest.mark.timeout(240)

REFERENCE = "examples.conformance_worker:worker"


def test_the_reference_worker_passes_every_case_strict_and_with_cancel(
    broker: None, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "async_task_api_worker", "run", REFERENCE]
    run = run_kit(start_subject("reference", command, {}, tmp_path), tmp_path, ["--with", "cancel"])
    assert run.code == 0, run.explain()
    assert run.verdicts == dict.fromkeys(ALL_CASES | {"cancel"}, "pass"), run.explain()
