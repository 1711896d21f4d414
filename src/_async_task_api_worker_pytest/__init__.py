"""The pytest plugin of async-task-api-worker: a ``worker_harness`` fixture.

Registered through the ``pytest11`` entry point, so it loads in every pytest run of an
environment where the SDK is installed. It is a module of its own, outside the package, so that
loading it imports nothing of the SDK (its import would cost every test run of the environment,
and would run before a coverage plugin starts measuring): the fixtures import the SDK when a
test asks for them, as Hypothesis's plugin does (``_hypothesis_pytestplugin``).

Fixtures (each overridable by a fixture of the same name in a ``conftest.py`` or a test
module):

- ``atw_worker``: the worker under test, loaded from the ``atw_worker`` ini option
  (``module:attribute``, as the commands take it: ``atw_worker = my_worker:worker``).
- ``atw_settings``: the harness's ``settings_overrides`` (``WorkerSettings`` field names);
  default none.
- ``worker_harness``: a started ``WorkerHarness`` of ``atw_worker``, closed after the test. It
  is an ``async`` fixture, for ``async def`` tests: use it with pytest-asyncio in auto mode
  (``asyncio_mode = "auto"``) or with anyio's plugin (``@pytest.mark.anyio``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from async_task_api_worker import Worker
    from async_task_api_worker.testing import WorkerHarness

__all__ = ["atw_settings", "atw_worker", "pytest_addoption", "worker_harness"]

#: The ini option naming the worker under test.
INI_WORKER = "atw_worker"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``atw_worker`` ini option."""
    parser.addini(
        INI_WORKER,
        "the worker the worker_harness fixture runs, as module:attribute (my_worker:worker)",
        default="",
    )


@pytest.fixture
def atw_worker(request: pytest.FixtureRequest) -> Worker:
    """The worker under test, named by the ``atw_worker`` ini option (``module:attribute``).

    Override it with a fixture of the same name to build the worker otherwise (per test
    module, or per test with ``@pytest.mark.parametrize(..., indirect=True)``).

    Raises:
        pytest.UsageError: (through ``pytest.fail``) the option is not set, or does not name a
            loadable ``Worker``; the message says which.
    """
    target = str(request.config.getini(INI_WORKER)).strip()
    if not target:
        pytest.fail(
            f"worker_harness needs the worker under test: set {INI_WORKER} = my_module:worker "
            "under [tool.pytest.ini_options] (or [pytest]), or define an atw_worker fixture",
            pytrace=False,
        )
    from async_task_api_worker.errors import ConfigError
    from async_task_api_worker.targets import load_worker

    try:
        return load_worker(target)
    except ConfigError as exc:
        pytest.fail(f"{INI_WORKER} = {target}: {exc}", pytrace=False)


@pytest.fixture
def atw_settings() -> Mapping[str, Any]:
    """``settings_overrides`` of the harness (``{"worker_task_timeout_s": 0.1}``); default none."""
    return {}


@pytest.fixture
async def worker_harness(
    atw_worker: Worker, atw_settings: Mapping[str, Any]
) -> AsyncIterator[WorkerHarness]:
    """A ``WorkerHarness`` of the worker under test, started, and closed after the test.

    Example::

        async def test_counts_the_words(worker_harness):
            run = await worker_harness.submit({"text": "hello big world"})
            run.assert_succeeded()
    """
    from async_task_api_worker.testing import WorkerHarness

    async with WorkerHarness(atw_worker, settings_overrides=atw_settings) as harness:
        yield harness
