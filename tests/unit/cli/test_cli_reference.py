"""docs/cli.md is scripts/cli_reference.py's output: the command line reference cannot drift
from the CLI's parser."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]


def _script() -> ModuleType:
    path = ROOT / "scripts" / "cli_reference.py"
    spec = importlib.util.spec_from_file_location("_cli_reference_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_page_is_the_scripts_output() -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    assert page == _script().render(), (
        "docs/cli.md is stale: run `uv run python scripts/cli_reference.py`"
    )


def test_every_command_has_its_section_and_a_link_to_its_exit_codes() -> None:
    script = _script()
    commands = list(script._commands(script._parser()))
    assert sorted(commands) == sorted(script.EXIT_CODES)
    page = (ROOT / "docs" / "cli.md").read_text()
    for name in commands:
        assert f"## {name}\n" in page
        assert f"usage: async-task-api-worker {name} " in page
