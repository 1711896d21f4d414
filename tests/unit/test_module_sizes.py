"""No module of the package over 400 lines (docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "async_task_api_worker"
LIMIT = 400


def test_no_module_is_over_400_lines() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert modules, f"no module found under {PACKAGE}"
    over = {
        str(path.relative_to(PACKAGE)): lines
        for path in modules
        if (lines := len(path.read_text().splitlines())) > LIMIT
    }
    assert over == {}
