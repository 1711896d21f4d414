"""``@worker.on_task_error``: a handler's unexpected exception, handed to an error tracker.

The hook gets the exception object and the task's fields; the logs never get the exception's
text; a hook that raises or hangs changes no conclusion and holds no task up.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest

from async_task_api_worker import DefinitionError, TaskErrorInput, Worker
from async_task_api_worker.errors import RemoteHandlerError
from async_task_api_worker.observability.logging import JsonFormatter, TaskContextFilter
from async_task_api_worker.protocol.codes import ErrorCode
from async_task_api_worker.task_call import ErrorHooks
from async_task_api_worker.task_call.error_hooks import EXIT_WAIT_S
from async_task_api_worker.testing import WorkerHarness
from tests.logs import attached
from tests.unit.integrations.hook_workers import (
    ISOLATED_TRACKER,
    SECRET,
    Tracker,
    async_worker,
    isolated,
    sync_worker,
)
from tests.unit.observability.test_tracing import fresh_interpreter

WAIT_S = 10


class _Lines(logging.Handler):
    """Every log line of the process, as the SDK's JSON formatter writes it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.addFilter(TaskContextFilter())
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def lines() -> Iterator[_Lines]:
    handler = _Lines()
    with attached(logging.getLogger(), handler, logging.DEBUG):
        yield handler


@pytest.mark.parametrize("sync", [False, True], ids=["async-def", "def"])
async def test_the_hook_gets_the_exception_and_the_fields_the_logs_get_no_text(
    sync: bool, lines: _Lines
) -> None:
    tracker = Tracker()
    worker = sync_worker(tracker) if sync else async_worker(tracker.capture)
    async with WorkerHarness(worker) as harness:
        run = await harness.submit({"mode": "crash"}, client_id="client-7", task_id="t-1")
    run.assert_failed(ErrorCode.INTERNAL_ERROR)
    assert tracker.arrived.wait(WAIT_S)
    (error,) = tracker.captured
    assert isinstance(error.exception, ValueError)
    assert str(error.exception) == SECRET  # the object itself, traceback and all
    assert error.exception.__traceback__ is not None
    assert (error.task_id, error.client_id, error.service, error.attempt) == (
        "t-1",
        "client-7",
        "hooked",
        1,
    )
    assert error.tags == {
        "task_id": "t-1",
        "client_id": "client-7",
        "service": "hooked",
        "attempt": "1",
    }
    assert any(
        "raised builtins.ValueError" in line or "raised ValueError" in line for line in lines.lines
    )
    assert not [line for line in lines.lines if "4111" in line]
    assert SECRET not in json.dumps(run.error.message if run.error else "")


async def test_a_success_or_a_declared_failure_is_not_handed_to_the_hook() -> None:
    tracker = Tracker()
    async with WorkerHarness(async_worker(tracker.capture)) as harness:
        (await harness.submit({"mode": "ok"})).assert_succeeded()
        (await harness.submit({"mode": "fatal"})).assert_failed("NO_GOOD")
        # One unexpected error after them: the hook's thread runs in order, so once it is
        # handed over, nothing came before it.
        (await harness.submit({"mode": "crash"})).assert_failed(ErrorCode.INTERNAL_ERROR)
    assert tracker.arrived.wait(WAIT_S)
    assert [type(e.exception) for e in tracker.captured] == [ValueError]


async def test_a_hook_that_raises_changes_nothing_and_its_text_is_not_logged(
    lines: _Lines,
) -> None:
    tracker = Tracker()

    def broken(error: TaskErrorInput) -> None:
        raise RuntimeError(f"the tracker failed on {error.exception}")

    worker = async_worker(broken, tracker.capture)  # the next hook still runs
    async with WorkerHarness(worker) as harness:
        run = await harness.submit({"mode": "crash"}, task_id="t-2")
    run.assert_failed(ErrorCode.INTERNAL_ERROR)
    assert tracker.arrived.wait(WAIT_S)
    said = [line for line in lines.lines if "on_task_error hook" in line]
    assert len(said) == 1
    assert "raised RuntimeError on the error of task t-2" in said[0]
    assert not [line for line in lines.lines if "4111" in line or "tracker failed" in line]


async def test_a_hook_that_hangs_holds_no_task_up_and_what_waits_is_bounded(
    lines: _Lines,
) -> None:
    release = threading.Event()
    entered = threading.Event()

    def hangs(error: TaskErrorInput) -> None:
        entered.set()
        release.wait(WAIT_S)

    hooks = ErrorHooks(max_waiting=2)
    try:
        first = TaskErrorInput(ValueError(SECRET), "t-a", "c", "hooked", 1, 5)
        hooks.tell((hangs,), first)
        assert entered.wait(WAIT_S)  # the hook runs, and hangs
        for n in range(4):  # two wait, two are dropped (said once)
            hooks.tell((hangs,), TaskErrorInput(ValueError(SECRET), f"t-{n}", "c", "hooked", 1, 5))
        dropped = [line for line in lines.lines if "errors behind" in line]
        assert len(dropped) == 1 and "t-2" in dropped[0]
        assert not [line for line in lines.lines if "4111" in line]
        assert not hooks.wait_idle(0)  # still in the first call
    finally:
        release.set()
    assert hooks.wait_idle(WAIT_S)


def test_errors_handed_over_as_the_process_exits_still_reach_the_hook() -> None:
    script = textwrap.dedent(
        """
        import sys
        from async_task_api_worker import TaskErrorInput
        from async_task_api_worker.task_call import tell
        from async_task_api_worker.testing import make_task_context

        def hook(error: TaskErrorInput) -> None:
            print("hooked", error.task_id, type(error.exception).__name__, flush=True)

        tell((hook,), ValueError("x"), make_task_context(task_id="t-exit"))
        # the main thread ends here: the interpreter waits for the hooks' thread to take it
        """
    )
    done = fresh_interpreter(script)
    assert done.stdout.strip() == "hooked t-exit ValueError"


def test_a_hung_hook_is_waited_for_within_the_shutdown_hooks_time_not_after() -> None:
    # The shutdown bound (runtime.hooks.shutdown_bound_s) has no room for EXIT_WAIT_S: the
    # hooks' wait is part of WORKER_SHUTDOWN_HOOKS_TIMEOUT_S, and the exit then waits no more.
    script = textwrap.dedent(
        """
        import asyncio, threading
        from async_task_api_worker.runtime.hooks import run_shutdown_hooks
        from async_task_api_worker.task_call import tell
        from async_task_api_worker.testing import make_task_context

        tell((lambda error: threading.Event().wait(),), ValueError("x"), make_task_context())
        asyncio.run(run_shutdown_hooks([], budget_s=0.2))
        print("shut down", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=EXIT_WAIT_S,  # the exit's own wait would take this long again
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "shut down"


async def test_tasks_conclude_while_their_hook_hangs() -> None:
    release = threading.Event()
    tracker = Tracker()

    def hangs(error: TaskErrorInput) -> None:
        tracker.capture(error)
        release.wait(WAIT_S)

    try:
        async with WorkerHarness(async_worker(hangs)) as harness:
            for _ in range(3):
                (await harness.submit({"mode": "crash"})).assert_failed(ErrorCode.INTERNAL_ERROR)
        assert tracker.arrived.wait(WAIT_S)
        assert len(tracker.captured) == 1  # still in the first call: the tasks did not wait
    finally:
        release.set()


async def test_a_process_isolated_tasks_hook_runs_in_the_worker_without_the_text(
    lines: _Lines,
) -> None:
    async with WorkerHarness(isolated) as harness:
        run = await harness.submit({"mode": "crash"}, task_id="t-iso", client_id="c-iso")
    run.assert_failed(ErrorCode.INTERNAL_ERROR)
    assert ISOLATED_TRACKER.arrived.wait(WAIT_S)
    (error,) = ISOLATED_TRACKER.captured
    assert isinstance(error.exception, RemoteHandlerError)
    assert error.exception.remote_type_name == "ValueError"
    assert "in _act" in error.exception.remote_traceback  # the child's frames
    assert (error.task_id, error.client_id) == ("t-iso", "c-iso")
    assert SECRET not in str(error.exception)
    assert not [line for line in lines.lines if "4111" in line]


def test_a_hook_must_be_callable() -> None:
    with pytest.raises(DefinitionError, match="on_task_error"):
        Worker("w").on_task_error("not a function")  # type: ignore[type-var]
