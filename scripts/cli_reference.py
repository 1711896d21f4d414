"""Write docs/cli.md, the command line reference, from the CLI's own argparse parser.

Usage::

    uv run python scripts/cli_reference.py          # (re)write docs/cli.md
    uv run python scripts/cli_reference.py --check  # exit 1 if the committed page differs

Each command's section is its ``--help`` text as ``async-task-api-worker COMMAND --help`` prints
it, formatted at a fixed width (``COLUMNS``) so the page does not depend on the terminal. The
exit codes are documented on each command's own page: the page links there.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from async_task_api_worker.cli.main import PROG, _parser

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "cli.md"
#: The width the help text is formatted at (argparse reads ``COLUMNS``).
WIDTH = "100"
#: Where each command's exit codes (and the rest of its story) are told.
EXIT_CODES = {
    "run": ("Running a worker", "running.md"),
    "check": ("Running a worker", "running.md"),
    "vectors": ("Conformance, the golden vectors", "conformance.md#the-golden-vectors"),
    "dev": ("Running a worker", "running.md"),
    "tick": ("The detached tick", "detached.md#the-tick-command"),
    "asyncapi": ("The contract as AsyncAPI 3.1", "contract.md#the-contract-as-asyncapi-31"),
    "submit": ("Submitting and cancelling", "clients.md"),
    "cancel": ("Submitting and cancelling", "clients.md#cancelling-a-task"),
    "conformance": ("Conformance, running the battery", "conformance.md#running-the-battery"),
    "inspect": ("Commands for operators", "commands.md#inspect"),
    "purge": ("Commands for operators", "commands.md#purge"),
    "reports": ("Commands for operators", "commands.md#reports"),
}

_HEADER = f"""# Command line

`{PROG} COMMAND --help` for each command, as it prints it (generated from the
CLI's parser by `scripts/cli_reference.py`; a test keeps this page equal to its output). A bad
setting or argument exits 2 with one line on stderr, for every command; each command's other
exit codes are on the page linked under it.
"""


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands' parsers, in the order ``--help`` lists them."""
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def render() -> str:
    """The page's text."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parser = _parser()
        parts = [_HEADER, "```text", parser.format_help().rstrip(), "```", ""]
        for name, command in _commands(parser).items():
            title, link = EXIT_CODES[name]
            parts += [f"## {name}", "", f"Exit codes and details: [{title}]({link}).", ""]
            parts += ["```text", command.format_help().rstrip(), "```", ""]
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Write the page, or with ``--check`` say whether it is stale; the exit code."""
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--check", action="store_true", help="exit 1 if the page differs")
    check = arguments.parse_args(argv).check
    text = render()
    if check:
        if PAGE.read_text() != text:
            print(f"{PAGE} is stale: run `uv run python scripts/cli_reference.py`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
