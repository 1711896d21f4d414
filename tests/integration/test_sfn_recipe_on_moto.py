"""docs/sfn.md's runnable recipe: examples/sfn_on_moto.py against moto's server."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.sfn_fixtures import REPO


def test_the_recipe_prints_each_execution_output(moto_url: str) -> None:
    """Two executions of one state machine: each has a name of its own (a repeated name fails
    the second ``start_execution``), and the worker ends both tokens."""
    done = subprocess.run(
        [sys.executable, "-m", "examples.sfn_on_moto", "--endpoint-url", moto_url,
         "hello big world", "one two"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ['SUCCEEDED {"words": 3}', 'SUCCEEDED {"words": 2}']
