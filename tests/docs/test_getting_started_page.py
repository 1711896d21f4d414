"""docs/getting-started.md and docs/testing.md: every block is accounted for, and the ones that
need no broker run here (the project's files, its harness tests, ``dev``).

The RabbitMQ blocks (``run``, ``submit``, ``cancel``) run in
tests/integration/test_getting_started.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import (
    GETTING_STARTED_RUNS,
    REPO,
    blocks,
    normalised,
    run_block,
    write_files,
)

PAGE = "getting-started.md"


def shell_env() -> dict[str, str]:
    """The environment of a reader's shell, in a project where the SDK is installed.

    The page's ``uv run X`` runs X in the project's environment: here that environment is this
    one (``UV_PROJECT_ENVIRONMENT``), used as it is (``UV_NO_SYNC``: nothing is installed). uv
    itself is found where it runs these tests from (``UV``), else on PATH.
    """
    environment = dict(os.environ)
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv is not None, "the page's commands run through uv, which is not on PATH"
    folders = [str(Path(sys.executable).parent), str(Path(uv).parent), environment["PATH"]]
    environment["PATH"] = os.pathsep.join(folders)
    environment["UV_PROJECT_ENVIRONMENT"] = sys.prefix
    environment["UV_NO_SYNC"] = "1"
    environment.pop("PYTEST_ADDOPTS", None)
    return environment


def shell(
    command: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``command`` as a reader's shell runs it, in ``cwd``."""
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=shell_env() if env is None else env,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("page", [PAGE, "testing.md"])
def test_every_block_is_run_or_says_why_not(page: str) -> None:
    found = blocks(page)
    unmarked = [block.text.splitlines()[0] for block in found if not block.kind]
    assert not unmarked, f"docs/{page}: blocks with no marker comment: {unmarked}"
    for block in found:
        if block.kind == "run by":
            runner = REPO / block.argument
            assert runner.is_file(), block.argument
            assert f'"{page}"' in runner.read_text(), f"{block.argument} does not read {page}"
        if block.kind == "not run":
            assert block.argument.strip(), "a block not run says why"


def test_the_run_blocks_are_the_ones_the_tests_run() -> None:
    names = [block.argument for block in blocks(PAGE) if block.kind == "run"]
    assert sorted(names) == sorted(GETTING_STARTED_RUNS)
    files = [block.argument for block in blocks(PAGE) if block.kind == "file"]
    assert files == ["my_worker.py", "pyproject.toml", "test_my_worker.py"]


def test_the_harness_tests_pass_as_shown(tmp_path: Path) -> None:
    write_files(PAGE, tmp_path)
    ((command, shown),) = run_block(PAGE, "pytest").steps()
    done = shell(command, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert normalised(done.stdout.strip().splitlines()[-2:]) == normalised(shown)


def test_dev_prints_what_the_page_shows(tmp_path: Path) -> None:
    write_files(PAGE, tmp_path)
    ((command, shown),) = run_block(PAGE, "dev").steps()
    done = shell(command, tmp_path)
    assert done.returncode == 0, done.stderr
    assert normalised(done.stdout.splitlines()) == normalised(shown)


def test_the_testing_page_tests_pass(tmp_path: Path) -> None:
    """docs/testing.md's tests of docs/worker.md's worker, and its two cancel tests (an
    ``async def`` and a ``def`` handler), with the getting-started page's pytest settings."""
    write_files(PAGE, tmp_path / "getting-started")
    (tmp_path / "pyproject.toml").write_bytes(
        (tmp_path / "getting-started/pyproject.toml").read_bytes()
    )
    assert write_files("worker.md", tmp_path) == ["count_words.py"]
    assert write_files("testing.md", tmp_path) == [
        "test_count_words.py", "slow_worker.py", "test_slow_worker.py"
    ]  # fmt: skip
    done = shell("pytest -q -p no:cacheprovider test_count_words.py test_slow_worker.py", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("5 passed")
