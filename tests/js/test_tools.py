"""The JavaScript tools' pins (``tests/js/package.json``, ``package-lock.json``), and their
install without npm: no npm needed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests import asyncapi_specs
from tests.js import tools
from tests.js.tools import HERE, ToolsUnavailableError


def _read(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((HERE / name).read_text(encoding="utf-8"))
    return document


def test_every_tool_is_pinned_to_one_version_and_the_lock_agrees() -> None:
    wanted = _read("package.json")["dependencies"]
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", version) for version in wanted.values()), wanted
    lock = _read("package-lock.json")
    assert lock["lockfileVersion"] == 3
    assert lock["packages"][""]["dependencies"] == wanted
    for name, version in wanted.items():
        assert lock["packages"][f"node_modules/{name}"]["version"] == version
    # npm ci checks every package's integrity against the lock.
    assert all("integrity" in entry for key, entry in lock["packages"].items() if key)


def test_the_parser_reads_the_asyncapi_schema_the_python_check_uses() -> None:
    # @asyncapi/parser validates with @asyncapi/specs, as tests/asyncapi_specs.py does.
    specs = _read("package-lock.json")["packages"]["node_modules/@asyncapi/specs"]
    assert (specs["version"], specs["integrity"]) == (
        asyncapi_specs.VERSION,
        asyncapi_specs.INTEGRITY,
    )


def test_without_npm_the_tools_are_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tools, "CACHE", tmp_path)
    monkeypatch.setattr(tools.shutil, "which", lambda name: None if name == "npm" else name)
    with pytest.raises(ToolsUnavailableError, match="node and npm are not both installed"):
        tools.install()
    assert list(tmp_path.iterdir()) == []
