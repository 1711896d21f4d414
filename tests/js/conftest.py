"""The pinned JavaScript tools (``tests/js/tools.py``), installed once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.js.tools import ToolsUnavailableError, install


@pytest.fixture(scope="session")
def js_tools() -> Path:
    """The folder of the tools' ``node_modules``: skip without them, fail under CI=true."""
    try:
        return install()
    except ToolsUnavailableError as exc:
        message = f"the JavaScript tools are not available: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: the ajv and Modelina checks must run)")
        pytest.skip(message)
