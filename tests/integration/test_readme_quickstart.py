"""The quickstart's commands produce the output they show.

The recipe is docs/getting-started.md's "Try the example, from a clone"; the README shows its
first command (``dev``) as one of its two set-up commands, the same block.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import (
    BROKER_URL,
    DEFAULT_BROKER_URL,
    REPO,
    Queues,
    broker_url,
    rabbitmqctl,
)
from tests.integration.test_cli_on_rabbitmq import cli

TIMESTAMP = re.compile(r'"timestamp":"[^"]+"')
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


GETTING_STARTED = REPO / "docs" / "getting-started.md"


def section_blocks(text: str) -> list[str]:
    """The text of each console block of ``text``."""
    return re.findall(r"```console\n(.*?)```", text, flags=re.S)


def quickstart_section() -> str:
    text = GETTING_STARTED.read_text()
    return text[text.index("## Try the example, from a clone") : text.index("## Where next")]


def console_blocks() -> list[list[tuple[str, list[str]]]]:
    """The quickstart's console blocks: each a list of ``(command line, shown output lines)``."""
    blocks: list[list[tuple[str, list[str]]]] = []
    for block in section_blocks(quickstart_section()):
        steps: list[tuple[str, list[str]]] = []
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
        blocks.append(steps)
    return blocks


def is_vhost_recipe(block: list[tuple[str, list[str]]]) -> bool:
    return any(line.startswith("rabbitmqctl add_vhost ") for line, _ in block)


def quickstart() -> list[tuple[list[str], list[str]]]:
    """``(command arguments, shown output lines)`` of each ``$ uv run`` line in the Quickstart
    (the vhost recipe aside)."""
    steps: list[tuple[list[str], list[str]]] = []
    for block in console_blocks():
        if is_vhost_recipe(block):
            continue
        for line, shown in block:
            words = shlex.split(line)
            assert words[:2] == ["uv", "run"], line
            steps.append((words[3:], shown))
    return steps


def vhost_recipe() -> list[list[str]]:
    """The words of each command of the Quickstart's quorum vhost recipe, as written."""
    (block,) = [block for block in console_blocks() if is_vhost_recipe(block)]
    return [shlex.split(line) for line, _ in block]


def normalised(lines: list[str]) -> list[str]:
    return [UUID.sub("UUID", TIMESTAMP.sub('"timestamp":"T"', line)) for line in lines]


def test_the_quickstart_has_the_three_commands() -> None:
    assert [arguments[0] for arguments, _ in quickstart()] == ["dev", "run", "submit"]


def test_the_readme_shows_the_quickstart_dev_block() -> None:
    text = (REPO / "README.md").read_text()
    readme = section_blocks(text[text.index("## Quickstart") : text.index("## Development")])
    assert readme == section_blocks(quickstart_section())[:1]


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


@pytest.fixture
def recipe_vhost(broker: None) -> Iterator[str]:
    """A unique name for the recipe's vhost ``work``, deleted after the test (its worker first:
    request this fixture before ``start_worker``)."""
    name = f"atw-recipe-{uuid.uuid4().hex[:8]}"
    yield name
    with contextlib.suppress(RuntimeError):  # the recipe failed before creating it
        rabbitmqctl("delete_vhost", name)


def test_the_quorum_vhost_recipe_as_written_ends_in_a_worker_at_attempt_1_of_5(
    recipe_vhost: str, start_worker: Any
) -> None:
    """Each command of the quickstart's recipe runs as written, ``work`` replaced by a unique vhost
    (and, on a broker other than the machine's, the URL by that broker's)."""
    *grants, export, run = vhost_recipe()
    env = Queues(recipe_vhost).env()
    del env["IN_QUEUE_NAME"], env["OUT_QUEUE_NAME"]  # the README's: the service's own
    for words in grants:
        assert words[0] == "rabbitmqctl"
        rabbitmqctl(*(recipe_vhost if word == "work" else word for word in words[1:]))
    assert export[0] == "export"
    name, url = export[1].split("=", 1)
    assert (name, urllib.parse.urlsplit(url).path) == ("BROKER_URL", "/work")
    env[name] = (
        url.replace("/work", f"/{recipe_vhost}")
        if BROKER_URL == DEFAULT_BROKER_URL
        else broker_url(recipe_vhost)
    )
    assert run[:4] == ["uv", "run", "async-task-api-worker", "run"]
    worker = start_worker(run[4], env, args=tuple(run[5:]))
    _, _, (submit_arguments, _) = quickstart()

    done = cli(*submit_arguments, env=env)

    assert done.returncode == 0, done.stderr
    worker.wait_for_log("Delivery settled: ")
    (decision,) = [line for line in worker.lines() if line["msg"].startswith("Delivery settled")]
    assert decision["msg"] == "Delivery settled: outcome=success action=ack code=- attempt=1/5"
    assert "is not a quorum queue" not in worker.log()
