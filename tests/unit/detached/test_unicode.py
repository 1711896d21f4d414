"""Issue 30's one Unicode rule on the detached face: a lone surrogate is INVALID_RESULT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from async_task_api_worker.conclusion import Failure
from async_task_api_worker.detached import Marker
from async_task_api_worker.detached.outcomes import detached_conclusion
from async_task_api_worker.detached.run import run_work
from async_task_api_worker.detached.state import read_json

TASK = "t-unicode"


@pytest.mark.parametrize("mode", ["surrogate_pair"])
def test_a_raw_surrogate_pair_in_a_result_is_invalid_as_in_process(
    tmp_path: Path, mode: str
) -> None:
    # In-process, two raw surrogates side by side are INVALID_RESULT; the result file's JSON
    # escapes them as a pair, which the sweep reads back joined into one valid character.
    context = {
        "task_id": TASK, "client_id": "c", "service": "isolated", "attempt": 1,
        "delivery_limit": 5, "input_refs": [],
    }  # fmt: skip
    (tmp_path / f"{TASK}.input").write_text(
        json.dumps({"input": {"mode": mode}, "context": context})
    )
    marker = Marker.new(TASK, 30.0, {})
    (tmp_path / f"{TASK}.running").write_bytes(marker.to_json())
    run_work(tmp_path, TASK, "tests.unit.process.workers:isolated", sdk_worker=True, marker=marker)
    conclusion = detached_conclusion(read_json(tmp_path / f"{TASK}.json"))
    assert isinstance(conclusion, Failure), conclusion
    assert conclusion.code == "INVALID_RESULT"
