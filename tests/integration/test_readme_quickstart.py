"""The README's quickstart commands produce the output the README shows."""

from __future__ import annotations

import re
import shlex
from typing import Any

from tests.integration.conftest import REPO, Queues
from tests.integration.test_cli_on_rabbitmq import cli

TIMESTAMP = re.compile(r'"timestamp":"[^"]+"')
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def quickstart() -> list[tuple[list[str], list[str]]]:
    """``(command arguments, shown output lines)`` of each ``$`` line in the Quickstart."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Quickstart") : text.index("## Install")]
    steps: list[tuple[list[str], list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", section, flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                words = shlex.split(line[2:])
                assert words[:2] == ["uv", "run"], line
                steps.append((words[3:], []))
            else:
                steps[-1][1].append(line)
    return steps


def normalised(lines: list[str]) -> list[str]:
    return [UUID.sub("UUID", TIMESTAMP.sub('"timestamp":"T"', line)) for line in lines]


def test_the_quickstart_has_the_three_commands() -> None:
    assert [arguments[0] for arguments, _ in quickstart()] == ["dev", "run", "submit"]


def test_dev_prints_what_the_readme_shows(queues: Queues) -> None:
    (arguments, shown), *_ = quickstart()
    done = cli(*arguments, env=queues.env())
    assert done.returncode == 0, done.stderr
    assert normalised(done.stdout.splitlines()) == normalised(shown)


def test_run_then_submit_print_what_the_readme_shows(queues: Queues, start_worker: Any) -> None:
    _, (run_arguments, _), (submit_arguments, shown) = quickstart()
    assert run_arguments[0] == "run"
    start_worker(run_arguments[1], queues.env())
    done = cli(*submit_arguments, env=queues.env())
    assert done.returncode == 0, done.stderr
    assert normalised(done.stdout.splitlines()) == normalised(shown)
