"""The JavaScript tools of the tests: ajv, ajv-formats, Modelina, @asyncapi/parser, TypeScript.

They are pinned in ``tests/js/package.json`` and ``package-lock.json`` (every package with its
integrity, which ``npm ci`` checks) and installed once, with one ``npm ci``, into
``.cache/js-tools/<hash of the two files>/`` (git-ignored): a change to either file installs
afresh, and the folder of an older pair is removed. The install goes to a scratch folder that
is renamed into place when complete, under a lock, so a run cut short leaves nothing half
made and two runs (a CI warm-up and the tests) install once between them.

``python -m tests.js.tools`` installs them and prints the folder (``.ci/run`` warms the cache
so in the background, early). The tests use :func:`install` through a session fixture
(``tests/js/conftest.py``): without node or npm, or without the registry, they skip, except
under ``CI=true``, where they fail.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CACHE = REPO / ".cache" / "js-tools"
PINNED = ("package.json", "package-lock.json")
#: One ``npm ci`` from a cold npm cache takes about 10 s on a quiet machine (313 packages,
#: 210 MB unpacked); this bounds a slow registry or a loaded machine.
NPM_CI_TIMEOUT_S = 300
#: A node run of the tests (a Modelina generation, a tsc build): a few seconds when quiet.
NODE_TIMEOUT_S = 180


class ToolsUnavailableError(Exception):
    """node or npm is missing, or ``npm ci`` failed (no registry, no network)."""


def _digest() -> str:
    hashed = hashlib.sha256()
    for name in PINNED:
        hashed.update((HERE / name).read_bytes())
    return hashed.hexdigest()[:16]


@contextmanager
def _locked() -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _npm_ci(scratch: Path) -> None:
    npm = shutil.which("npm")
    assert npm is not None, "install() checks it"
    for name in PINNED:
        shutil.copyfile(HERE / name, scratch / name)
    command = [
        npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline",
        "--loglevel=error", "--fetch-retries=2",
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, cwd=scratch, capture_output=True, text=True, timeout=NPM_CI_TIMEOUT_S,
            check=False, env={**os.environ, "npm_config_update_notifier": "false"},
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise ToolsUnavailableError(f"npm ci timed out after {NPM_CI_TIMEOUT_S} s") from exc
    if done.returncode != 0:
        # npm's first error line says why (its last one only points at a log file).
        said = next(
            (line for line in done.stderr.splitlines() if line.startswith("npm error")),
            done.stderr.strip() or f"exit code {done.returncode}",
        )
        raise ToolsUnavailableError(f"npm ci failed: {said}")


def install() -> Path:
    """The folder whose ``node_modules`` holds the pinned tools, installed on first use.

    Raises:
        ToolsUnavailableError: they are not installed, and cannot be.
    """
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise ToolsUnavailableError("node and npm are not both installed")
    target = CACHE / _digest()
    if (target / "node_modules").is_dir():
        return target
    with _locked():
        if (target / "node_modules").is_dir():  # another run installed them meanwhile
            return target
        # Under the lock, anything else here is an older install or a run's remains.
        for other in CACHE.iterdir():
            if other.is_dir():
                shutil.rmtree(other, ignore_errors=True)
        scratch = Path(tempfile.mkdtemp(dir=CACHE, prefix=".install-"))
        try:
            _npm_ci(scratch)
            os.replace(scratch, target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def node(tools: Path, script: Path, *args: str, stdin: str | None = None) -> Any:
    """Run the JavaScript file ``script`` with the tools' modules; return what it prints (JSON).

    Raises:
        AssertionError: the script failed (its stderr is in the message).
    """
    node_binary = shutil.which("node")
    assert node_binary is not None, "node is not installed"
    done = subprocess.run(
        [node_binary, str(script), *args],
        input=stdin, capture_output=True, text=True, timeout=NODE_TIMEOUT_S, check=False,
        env={**os.environ, "NODE_PATH": str(tools / "node_modules")},
    )  # fmt: skip
    assert done.returncode == 0, f"node {script} exited {done.returncode}:\n{done.stderr}"
    return json.loads(done.stdout)


def tsc(tools: Path, project: Path) -> subprocess.CompletedProcess[str]:
    """``tsc -p project`` with the pinned TypeScript (its output: the errors, if any)."""
    node_binary = shutil.which("node")
    assert node_binary is not None, "node is not installed"
    compiler = tools / "node_modules" / "typescript" / "bin" / "tsc"
    return subprocess.run(
        [node_binary, str(compiler), "-p", str(project)],
        capture_output=True, text=True, timeout=NODE_TIMEOUT_S, check=False,
    )  # fmt: skip


if __name__ == "__main__":
    try:
        print(install())
    except ToolsUnavailableError as exc:
        sys.exit(f"the JavaScript tools could not be installed: {exc}")
