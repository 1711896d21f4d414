"""The code blocks of a docs page, each with the marker comment that says what the tests do with it.

Every fenced block of a page the tests run (docs/getting-started.md, docs/testing.md's recipes)
follows an HTML comment, so that the page cannot drift from what the tests run:

- ``<!-- file: NAME -->``: the block is the file NAME of the reader's project;
- ``<!-- run: NAME -->``: a console block whose ``$ `` lines the tests run, the run NAME saying
  how (tests/docs/test_getting_started_page.py, tests/integration/test_getting_started.py);
- ``<!-- run by PATH -->``: a console block another test file runs;
- ``<!-- not run: WHY -->``: a block the tests cannot run, and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

_FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<text>.*?)^```$", re.M | re.S)
_MARKER = re.compile(r"<!-- (?P<kind>file: |run: |run by |not run: )(?P<argument>.+?) -->")
TIMESTAMP = re.compile(r'"timestamp":"[^"]+"')
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PYTEST_TIME = re.compile(r" in [0-9.]+s$")

#: How the getting-started page's ``run:`` blocks are run, by name.
GETTING_STARTED_RUNS = {
    "pytest": "tests/docs/test_getting_started_page.py",
    "dev": "tests/docs/test_getting_started_page.py",
    "vhost": "tests/integration/test_getting_started.py",
    "worker": "tests/integration/test_getting_started.py",
    "submit": "tests/integration/test_getting_started.py",
    "slow-submit": "tests/integration/test_getting_started.py",
    "cancel": "tests/integration/test_getting_started.py",
}


@dataclass(frozen=True)
class Block:
    """A fenced block: its marker (``file``, ``run``, ``run by``, ``not run``, or ``""`` for
    none), the marker's argument, its language, and its text."""

    kind: str
    argument: str
    lang: str
    text: str

    def steps(self) -> list[tuple[str, list[str]]]:
        """A console block's ``(command line, shown output lines)``, one per ``$ `` line."""
        steps: list[tuple[str, list[str]]] = []
        for line in self.text.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
        return steps


def blocks(page: str) -> list[Block]:
    """The top-level fenced blocks of ``docs/<page>``, in order, each with its marker."""
    text = (DOCS / page).read_text()
    found = []
    for fence in _FENCE.finditer(text):
        before = text[: fence.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.fullmatch(before.strip())
        kind, argument = ("", "") if marker is None else (
            marker["kind"].rstrip(": "), marker["argument"]
        )  # fmt: skip
        found.append(Block(kind, argument, fence["lang"], fence["text"]))
    return found


def write_files(page: str, folder: Path) -> list[str]:
    """Write the ``file:`` blocks of ``page`` into ``folder``; returns their names."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for block in blocks(page):
        if block.kind == "file":
            (folder / block.argument).write_text(block.text)
            names.append(block.argument)
    return names


def run_block(page: str, name: str) -> Block:
    """The ``run: name`` block of ``page``."""
    (block,) = [block for block in blocks(page) if block.kind == "run" and block.argument == name]
    return block


def normalised(lines: list[str]) -> list[str]:
    """Lines with what differs from run to run (timestamps, UUIDs, pytest's time) replaced."""
    return [
        PYTEST_TIME.sub(" in Ts", UUID.sub("UUID", TIMESTAMP.sub('"timestamp":"T"', line)))
        for line in lines
    ]
