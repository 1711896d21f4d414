"""Several worker processes (``run --processes N``): settings, refusals, the bound, the restart
rule on a fake clock, the supervisor over fake processes, and readiness and metrics adding up.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import prometheus_client.values
import pytest
from prometheus_client.parser import text_string_to_metric_families

from async_task_api_worker.cli import main
from async_task_api_worker.cli.loading import load_worker
from async_task_api_worker.errors import SettingsError
from async_task_api_worker.observability.metrics import WorkerMetrics
from async_task_api_worker.observability.probes import ProbesServer, ReadinessCheck
from async_task_api_worker.observability.processes import ProcessesMetrics
from async_task_api_worker.ports import (
    Action,
    DeliveryReceived,
    DeliverySettled,
    Outcome,
    Settlement,
)
from async_task_api_worker.runtime.entry import shutdown_bounds
from async_task_api_worker.runtime.exit_codes import ExitCode
from async_task_api_worker.runtime.hooks import shutdown_bound_s
from async_task_api_worker.runtime.processes import (
    KILL_MARGIN_S,
    RestartPolicy,
    Supervisor,
    shutdown_bound_of,
)
from async_task_api_worker.runtime.supervised import PROCESS_ENV, child_link
from async_task_api_worker.settings import load_settings
from tests.probes_client import request

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TARGET = "examples.count_words:worker"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES.parent)
    monkeypatch.delenv("WORKER_PROCESSES", raising=False)


def one_line(err: str) -> str:
    assert err.count("\n") == 1, err
    return err.strip()


# --- the setting and the flag ----------------------------------------------------------------


def test_worker_processes_is_1_by_default_and_read_from_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings(read_environment=False).worker_processes == 1
    monkeypatch.setenv("WORKER_PROCESSES", "4")
    assert load_settings().worker_processes == 4


@pytest.mark.parametrize(
    ("variable", "flag", "count"), [("3", "1", 1), ("1", "2", 2), ("2", None, 2)]
)
def test_the_flag_wins_over_the_variable(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    flag: str | None,
    count: int,
) -> None:
    monkeypatch.setenv("WORKER_PROCESSES", variable)
    argv = ["check", TARGET] + ([] if flag is None else ["--processes", flag])
    assert main(argv) == 0
    assert f"processes: {count} (--processes / WORKER_PROCESSES)" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize(
    ("environment", "says"),
    [
        ({"WORKER_MODE": "job"}, "job mode runs one process"),
        (
            {
                "WORKER_TRANSPORT": "sqs-sfn",
                "SQS_QUEUE_URL": "https://sqs.eu-west-1.amazonaws.com/1/words",
            },
            "sqs-sfn runs one process per ECS task (task protection is task-wide)",
        ),
    ],
)
def test_job_mode_and_sqs_sfn_refuse_several_processes_with_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    environment: dict[str, str],
    says: str,
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert main([command, TARGET, "--processes", "2"]) == ExitCode.CONFIG
    line = one_line(capsys.readouterr().err)
    assert line.startswith(
        "async-task-api-worker: invalid setting WORKER_PROCESSES (--processes): "
    )
    assert says in line
    # The same variable through the environment, and one process is fine.
    monkeypatch.setenv("WORKER_PROCESSES", "2")
    assert main(["check", TARGET]) == ExitCode.CONFIG
    capsys.readouterr()
    assert main(["check", TARGET, "--processes", "1"]) == ExitCode.OK


@pytest.mark.parametrize("count", ["0", "129"])
def test_a_count_out_of_range_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], count: str
) -> None:
    assert main(["run", TARGET, "--processes", count]) == ExitCode.CONFIG
    assert "invalid setting WORKER_PROCESSES (--processes): Input should be" in one_line(
        capsys.readouterr().err
    )


async def test_worker_run_and_serve_refuse_several_processes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_PROCESSES", "2")
    worker = load_worker(TARGET)
    with pytest.raises(SettingsError, match="WORKER_PROCESSES: 2 processes need the run command"):
        await worker.serve()
    with pytest.raises(SystemExit) as exited:
        await asyncio.to_thread(worker.run)
    assert exited.value.code == ExitCode.CONFIG
    assert "2 processes need the run command" in one_line(capsys.readouterr().err)


def test_a_malformed_link_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    assert child_link() is None
    monkeypatch.setenv(PROCESS_ENV, "1:x")
    with pytest.raises(SettingsError, match=PROCESS_ENV):
        child_link()
    monkeypatch.setenv(PROCESS_ENV, "2:7:100")
    link = child_link()
    assert link is not None and (link.index, link.probes_fd, link.supervisor_pid) == (2, 7, 100)


# --- the bound: one rule, printed by check ---------------------------------------------------


def test_the_bound_adds_the_margin_above_one_process_only() -> None:
    process_bound_s = shutdown_bound_s(load_settings(read_environment=False))
    assert shutdown_bound_of(1, process_bound_s) == process_bound_s
    assert shutdown_bound_of(3, process_bound_s) == process_bound_s + KILL_MARGIN_S


def test_check_prints_the_count_and_the_bound_it_computes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_SHUTDOWN_GRACE_S", "10")
    monkeypatch.setenv("WORKER_CONCURRENCY", "4")
    assert main(["check", TARGET, "--processes", "3"]) == 0
    out = capsys.readouterr().out
    settings = load_settings({"worker_processes": 3})
    _, process_bound_s = shutdown_bounds(load_worker(TARGET), settings)
    bound_s = shutdown_bound_of(3, process_bound_s)
    assert "processes: 3 (--processes / WORKER_PROCESSES) under a supervisor" in out
    assert "up to 12 tasks at once (3 x WORKER_CONCURRENCY 4)" in out
    assert f"shutdown bound: {bound_s:g} s after SIGTERM (a process's {process_bound_s:g} s" in out
    assert f"terminationGracePeriodSeconds: {math.ceil(bound_s) + 1}" in out


# --- the restart rule, on a fake clock -------------------------------------------------------


def test_restart_delays_double_up_to_the_cap_and_reset_after_a_stable_run() -> None:
    policy = RestartPolicy(max_deaths=100)
    now, delays = 0.0, []
    for _ in range(7):
        started = now
        now += 5.0  # up 5 s each time: never stable
        delay = policy.died(started_at=started, now=now)
        assert delay is not None
        delays.append(delay)
        now += delay
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    started = now
    now += 60.0  # up a whole minute: the series starts again
    assert policy.died(started_at=started, now=now) == 1.0


def test_the_fifth_death_within_60_s_gives_up() -> None:
    policy = RestartPolicy()
    now = 0.0
    for expected in (1.0, 2.0, 4.0, 8.0):
        delay = policy.died(started_at=now, now=now + 0.5)
        assert delay == expected
        now += 0.5 + delay
    assert now < 60
    assert policy.died(started_at=now, now=now + 0.5) is None


def test_deaths_spread_wider_than_the_window_never_give_up() -> None:
    policy = RestartPolicy()
    now = 0.0
    for _ in range(20):
        delay = policy.died(started_at=now, now=now + 20.0)  # 4 deaths fit in 60 s, not 5
        assert delay is not None
        now += 20.0 + delay


# --- the supervisor, over fake processes -----------------------------------------------------


class FakeProcess:
    """A worker process that ends when told to, or on SIGTERM unless it ignores it."""

    def __init__(self, pid: int, *, ignores_sigterm: bool = False) -> None:
        self.pid = pid
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.probes_port = 1
        self.ignores_sigterm = ignores_sigterm
        self.terms = 0
        self.killed = False

    def end(self, code: int) -> None:
        if not self.exited.done():
            self.exited.set_result(code)

    def terminate(self) -> None:
        self.terms += 1
        if not self.ignores_sigterm:
            self.end(0)

    def kill(self) -> None:
        self.killed = True
        self.end(-9)


class Spawner:
    """Starts fake processes; ``behave(index)`` decides what each new one does."""

    def __init__(self, behave: Callable[[FakeProcess, int], None] = lambda p, i: None) -> None:
        self.started: list[tuple[int, FakeProcess]] = []
        self._behave = behave
        self._changed = asyncio.Event()

    async def __call__(self, index: int) -> FakeProcess:
        process = FakeProcess(1000 + len(self.started))
        self.started.append((index, process))
        self._behave(process, index)
        self._changed.set()
        return process

    async def until(self, count: int) -> None:
        while len(self.started) < count:
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), timeout=5)


def fast_policy() -> RestartPolicy:
    return RestartPolicy(first_delay_s=0.01, max_delay_s=0.04)


def supervisor(spawner: Spawner, *, processes: int = 2, process_bound_s: float = 5.0) -> Supervisor:
    return Supervisor(
        processes=processes, process_bound_s=process_bound_s, spawn=spawner, policy=fast_policy
    )


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="async_task_api_worker")
    return caplog


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


async def test_a_dead_process_is_started_again_and_a_stop_ends_them_all_with_0(
    logs: pytest.LogCaptureFixture,
) -> None:
    spawner = Spawner()
    ended: list[int] = []
    watched = Supervisor(
        processes=2, process_bound_s=5, spawn=spawner, policy=fast_policy, on_exit=ended.append
    )
    running = asyncio.ensure_future(watched.run())
    await spawner.until(2)
    assert sorted(watched.pids()) == [1000, 1001]
    first = spawner.started[0][1]
    first.end(-9)
    await spawner.until(3)
    assert spawner.started[2][0] == spawner.started[0][0]  # the same process-<n> again
    assert ended == [first.pid]
    watched.request_stop("SIGTERM")
    assert await running == ExitCode.OK
    assert [process.terms for _, process in spawner.started[1:]] == [1, 1]
    assert any(
        "ended unexpectedly (killed by SIGKILL)" in m for m in messages(logs, logging.WARNING)
    )
    assert not messages(logs, logging.ERROR)


async def test_a_process_that_exits_2_is_not_restarted_and_the_supervisor_exits_2(
    logs: pytest.LogCaptureFixture,
) -> None:
    spawner = Spawner(lambda process, index: process.end(2) if index == 2 else None)
    assert await supervisor(spawner).run() == ExitCode.CONFIG
    assert len(spawner.started) == 2
    assert spawner.started[0][1].terms == 1  # the other one was stopped
    (error,) = messages(logs, logging.ERROR)
    assert "process-2" in error and "exited 2 (a configuration error)" in error


async def test_a_process_that_keeps_dying_gives_up_with_exit_1_and_one_error_line(
    logs: pytest.LogCaptureFixture,
) -> None:
    spawner = Spawner(lambda process, index: process.end(1) if index == 1 else None)
    assert await asyncio.wait_for(supervisor(spawner).run(), timeout=10) == ExitCode.FAILURE
    assert [index for index, _ in spawner.started].count(1) == 5
    (error,) = messages(logs, logging.ERROR)
    assert error == "Worker process-1 died 5 times within 60 s (the last: exit code 1): giving up"


async def test_a_process_past_the_bound_is_killed_and_the_exit_code_is_1(
    logs: pytest.LogCaptureFixture,
) -> None:
    spawner = Spawner(lambda process, index: setattr(process, "ignores_sigterm", index == 2))
    watched = supervisor(spawner, process_bound_s=0.2)
    running = asyncio.ensure_future(watched.run())
    await spawner.until(2)
    watched.request_stop("SIGTERM")
    watched.request_stop("SIGTERM")  # a second one is sent on too
    assert await running == ExitCode.FAILURE
    stuck = spawner.started[1][1]
    assert (stuck.terms, stuck.killed) == (2, True)
    assert not spawner.started[0][1].killed
    assert any(
        "still runs 0.2 s after the stop request" in m for m in messages(logs, logging.ERROR)
    )


async def test_a_process_ended_by_the_forwarded_sigterm_stopped_cleanly() -> None:
    spawner = Spawner(lambda process, index: setattr(process, "ignores_sigterm", True))
    watched = supervisor(spawner)
    running = asyncio.ensure_future(watched.run())
    await spawner.until(2)
    watched.request_stop("SIGINT")
    spawner.started[0][1].end(-15)  # still starting: Python's default action
    spawner.started[1][1].end(1)  # a stuck handler after its drain
    assert await running == ExitCode.FAILURE
    spawner = Spawner(lambda process, index: setattr(process, "ignores_sigterm", True))
    watched = supervisor(spawner, processes=1)
    running = asyncio.ensure_future(watched.run())
    await spawner.until(1)
    watched.request_stop("SIGTERM")
    spawner.started[0][1].end(-15)
    assert await running == ExitCode.OK


async def test_a_process_that_cannot_start_exits_1() -> None:
    async def cannot(index: int) -> FakeProcess:
        raise OSError("no more processes")

    watched = Supervisor(processes=2, process_bound_s=1, spawn=cannot)
    assert await watched.run() == ExitCode.FAILURE


async def test_readiness_names_a_process_being_restarted_then_draining() -> None:
    dead: list[int] = []
    spawner = Spawner()
    watched = Supervisor(
        processes=2,
        process_bound_s=5,
        spawn=spawner,
        policy=lambda: RestartPolicy(first_delay_s=30),
        on_exit=dead.append,
    )
    running = asyncio.ensure_future(watched.run())
    await spawner.until(2)
    assert watched.readiness() == {}
    spawner.started[1][1].end(-11)
    while not dead:
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert watched.readiness() == {"process-2": "not running (restarting in 30 s)"}
    watched.request_stop("SIGTERM")
    assert watched.readiness() == {"draining": "the worker is shutting down"}
    assert await running == ExitCode.OK
    assert len(spawner.started) == 2  # the stop ended the wait: no restart


# --- readiness across processes, through real probes servers ---------------------------------


@pytest.fixture
async def process_probes() -> AsyncIterator[list[dict[str, str]]]:
    """Two worker processes' probes servers; each reports the components in its dict."""
    states: list[dict[str, str]] = [{}, {}]
    servers = []
    for state in states:
        server = ProbesServer(
            host="127.0.0.1",
            port=0,
            readiness=ReadinessCheck(lambda state=state: state, {}),
            metrics=lambda accept: (b"", "text/plain"),
        )
        await server.start()
        servers.append(server)
        state["port"] = str(server.port)
    yield states
    for server in servers:
        await server.close()


async def test_ready_is_ready_only_while_every_process_is(
    process_probes: list[dict[str, str]],
) -> None:
    ports = [int(state.pop("port")) for state in process_probes]

    def spawning(process: FakeProcess, index: int) -> None:
        process.probes_port = ports[index - 1]

    spawner = Spawner(spawning)
    watched = supervisor(spawner)
    running = asyncio.ensure_future(watched.run())
    await spawner.until(2)
    server = ProbesServer(
        host="127.0.0.1",
        port=0,
        readiness=ReadinessCheck(watched.readiness, {}, delegated=watched.processes_readiness),
        metrics=lambda accept: (b"", "text/plain"),
    )
    await server.start()
    try:
        assert (await request(server.port, "/ready")).status == 200
        process_probes[1]["broker"] = "not connected yet"
        answer = await request(server.port, "/ready")
        assert answer.status == 503
        assert answer.json()["components"] == {"process-2": "broker (not connected yet)"}
        process_probes[1].clear()
        assert (await request(server.port, "/ready")).status == 200
        with socket.socket() as unused:  # bound, never listening: a process still starting
            unused.bind(("127.0.0.1", 0))
            spawner.started[0][1].probes_port = unused.getsockname()[1]
            answer = await request(server.port, "/ready")
        assert answer.json()["components"] == {
            "process-1": "starting (its probes server is not listening yet)"
        }
        watched.request_stop("SIGTERM")
        answer = await request(server.port, "/ready")
        assert answer.json()["components"] == {"draining": "the worker is shutting down"}
    finally:
        await server.close()
    assert await running == ExitCode.OK


# --- metrics across processes ----------------------------------------------------------------


def settled(outcome: Outcome) -> DeliverySettled:
    settlement = Settlement(
        outcome=outcome, action=Action.ACK, code=None, task_id="t", attempt=1, delivery_limit=5
    )
    return DeliverySettled(settlement=settlement, handler_ran=True, duration_s=0.2)


def test_the_processes_metrics_add_up_family_by_family(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))

    def process(pid: int, successes: int, in_flight: int, lag_s: float) -> None:
        # What a worker process started with PROMETHEUS_MULTIPROC_DIR does, under pid `pid`.
        monkeypatch.setattr(
            prometheus_client.values,
            "ValueClass",
            prometheus_client.values.MultiProcessValue(lambda: pid),
        )
        metrics = WorkerMetrics()
        for _ in range(successes + in_flight):
            metrics.notify(DeliveryReceived())
        for _ in range(successes):
            metrics.notify(settled(Outcome.SUCCESS))
        metrics.set_loop_lag(lag_s)

    process(101, successes=3, in_flight=1, lag_s=0.05)
    process(102, successes=4, in_flight=2, lag_s=0.5)
    process(103, successes=2, in_flight=5, lag_s=9.0)
    monkeypatch.undo()
    pooled = ProcessesMetrics(str(tmp_path), pids=lambda: [])
    pooled.process_dead(103)  # its counts stay; its in-flight and lag go with it

    body, content_type = pooled.exposition()
    assert content_type.startswith("text/plain")
    values = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }
    assert values[("worker_tasks_total", (("status", "success"),))] == 9
    assert values[("worker_tasks_total", (("status", "failure"),))] == 0
    assert values[("worker_task_duration_seconds_count", ())] == 9
    assert values[("worker_tasks_in_flight", ())] == 3
    assert values[("event_loop_lag_seconds", (("component", "worker"),))] == 0.5
    assert values[("worker_sdk_info", (("version", "0.1.0"),))] == 1
    assert values[("process_resident_memory_bytes", ())] > 0
    names = {name for name, _ in values}
    assert not any(name.startswith("python_gc_") for name in names)
    assert "worker_detached_unreadable_files_total" not in names
    assert not any("pid" in dict(labels) for _, labels in values)


def test_a_probes_port_in_use_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from async_task_api_worker.runtime.processes import supervise

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        settings = load_settings(
            {
                "worker_processes": 2,
                "health_check_host": "127.0.0.1",
                "health_check_port": busy.getsockname()[1],
            },
            read_environment=False,
        )
        assert supervise(TARGET, settings, process_bound_s=1) == ExitCode.CONFIG
    line = one_line(capsys.readouterr().err)
    assert (
        "HEALTH_CHECK_HOST/HEALTH_CHECK_PORT (--health-port): cannot listen on 127.0.0.1:" in line
    )
