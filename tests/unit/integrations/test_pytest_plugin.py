"""The pytest plugin: a user's project tests its worker with the ``worker_harness`` fixture.

A project of the user's own in a temporary directory, run by pytest in a subprocess (the
plugin loads from its ``pytest11`` entry point, as in the user's environment).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

WORKER = """
from pydantic import BaseModel

from async_task_api_worker import FatalError, TaskContext, Worker


class Input(BaseModel):
    text: str


class Output(BaseModel):
    words: int


worker = Worker("count-words")


@worker.task(timeout=5)
async def handle(task_input: Input, ctx: TaskContext) -> Output:
    if not task_input.text.strip():
        raise FatalError("EMPTY_TEXT", "the text is blank")
    return Output(words=len(task_input.text.split()){off_by})
"""

TESTS = """
async def test_counts_the_words(worker_harness):
    run = await worker_harness.submit({"text": "hello big world"})
    run.assert_succeeded()
    assert run.response == {"words": 3}


async def test_a_blank_text_fails_with_its_code(worker_harness):
    run = await worker_harness.submit({"text": "  "})
    run.assert_failed(code="EMPTY_TEXT")
"""

SETTINGS_TESTS = """
import pytest


@pytest.fixture
def atw_settings():
    return {"worker_task_timeout_s": 0.5}


async def test_the_settings_fixture_reaches_the_harness(worker_harness):
    assert worker_harness.settings.worker_task_timeout_s == 0.5
"""

INI = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
atw_worker = my_worker:worker
"""


def _project(tmp_path: Path, *, off_by: str = "", ini: str = INI) -> Path:
    (tmp_path / "my_worker.py").write_text(WORKER.format(off_by=off_by))
    (tmp_path / "test_my_worker.py").write_text(TESTS)
    (tmp_path / "test_settings.py").write_text(SETTINGS_TESTS)
    (tmp_path / "pytest.ini").write_text(ini)
    return tmp_path


def _pytest(project: Path) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=environment,
    )


def _summary(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout.strip().splitlines()[-1]


def test_a_users_tests_pass_with_the_fixture_on_a_right_worker(tmp_path: Path) -> None:
    done = _pytest(_project(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert _summary(done).startswith("3 passed"), done.stdout


def test_a_users_tests_fail_on_a_wrong_worker(tmp_path: Path) -> None:
    done = _pytest(_project(tmp_path, off_by=" + 1"))  # counts one word too many
    assert done.returncode == 1, done.stdout + done.stderr
    assert _summary(done).startswith("1 failed, 2 passed"), done.stdout
    assert "assert {'words': 4} == {'words': 3}" in done.stdout


def test_without_the_ini_option_the_fixture_says_what_to_set(tmp_path: Path) -> None:
    ini = INI.replace("atw_worker = my_worker:worker\n", "")
    done = _pytest(_project(tmp_path, ini=ini))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "set atw_worker = my_module:worker" in done.stdout


def test_a_target_that_is_not_a_worker_is_named(tmp_path: Path) -> None:
    done = _pytest(_project(tmp_path, ini=INI.replace("my_worker:worker", "my_worker:nope")))
    assert done.returncode == 1
    assert "atw_worker = my_worker:nope: module 'my_worker' has no attribute 'nope'" in done.stdout


def test_loading_the_plugin_imports_nothing_of_the_sdk() -> None:
    script = textwrap.dedent(
        """
        import sys
        import _async_task_api_worker_pytest
        print(sorted(m for m in sys.modules if m.startswith("async_task_api_worker")))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"
