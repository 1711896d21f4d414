"""The runner's readiness through the probes server: startup, broker, drain, job quota."""

from __future__ import annotations

import asyncio
import socket

import pytest
from pydantic import BaseModel

from async_task_api_worker import TaskContext, Worker
from async_task_api_worker.client import build_envelope
from async_task_api_worker.errors import SettingsError
from async_task_api_worker.runtime import ExitCode, Runner
from async_task_api_worker.runtime.observed import serving_probes
from async_task_api_worker.settings import WorkerSettings, load_settings
from async_task_api_worker.transports.memory import InMemoryTransport
from tests.polling import until
from tests.probes_client import request


class In(BaseModel):
    pass


class Out(BaseModel):
    ok: bool = True


class Flaky(InMemoryTransport):
    """An in-memory broker whose connection can be cut (``consuming`` goes false)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = True
        self.blocked = False

    @property
    def consuming(self) -> bool:
        return self.up and super().consuming

    @property
    def publishing_blocked(self) -> bool:
        return self.blocked


def settings(**values: object) -> WorkerSettings:
    return load_settings(
        {"health_check_host": "127.0.0.1", "health_check_port": 0, **values},
        read_environment=False,
    )


def body(number: int) -> bytes:
    return build_envelope({}, service="svc", task_id=f"t-{number}", client_id="c")[1]


async def test_health_answers_during_startup_and_ready_names_the_broker() -> None:
    worker = Worker("svc")
    checked = asyncio.Event()
    in_hook = asyncio.Event()

    @worker.on_startup
    async def load() -> None:
        in_hook.set()
        await checked.wait()

    @worker.task(timeout=5)
    async def handle(task_input: In, ctx: TaskContext) -> Out:
        return Out()

    transport = Flaky()
    runner = Runner(worker, settings(), transport)
    async with serving_probes(runner) as server:
        serving = asyncio.ensure_future(runner.serve())
        await in_hook.wait()
        assert (await request(server.port, "/health")).status == 200
        ready = await request(server.port, "/ready")
        assert ready.status == 503
        assert ready.json()["components"] == {"broker": "not connected yet"}
        checked.set()
        await until(lambda: transport.consuming, 5, "the runner to consume")
        assert (await request(server.port, "/ready")).status == 200
        transport.up = False
        lost = await request(server.port, "/ready")
        assert lost.status == 503
        assert list(lost.json()["components"]) == ["broker"]
        transport.up = True
        assert (await request(server.port, "/ready")).status == 200
        transport.blocked = True  # a memory alarm: reports would be held
        blocked = await request(server.port, "/ready")
        assert blocked.status == 503
        assert "cannot be published" in blocked.json()["components"]["broker"]
        transport.blocked = False
        assert (await request(server.port, "/ready")).status == 200
        runner.request_shutdown("test")
        draining = await request(server.port, "/ready")
        assert draining.json()["components"] == {"draining": "the worker is shutting down"}
        assert (await request(server.port, "/health")).status == 200
        assert await serving is ExitCode.OK


async def test_a_job_is_not_ready_once_its_quota_is_in_hand() -> None:
    worker = Worker("svc")
    entered = asyncio.Event()
    release = asyncio.Event()

    @worker.task(timeout=5)
    async def handle(task_input: In, ctx: TaskContext) -> Out:
        entered.set()
        await release.wait()
        return Out()

    transport = InMemoryTransport()
    transport.put(body(1))
    runner = Runner(worker, settings(worker_mode="job"), transport)
    async with serving_probes(runner) as server:
        serving = asyncio.ensure_future(runner.serve())
        await entered.wait()
        assert runner.quota_reached
        ready = await request(server.port, "/ready")
        assert ready.status == 503
        assert set(ready.json()["components"]) == {"draining"}
        release.set()
        assert await serving is ExitCode.OK


async def test_the_worker_probe_hooks_are_evaluated() -> None:
    worker = Worker("svc")
    healthy = True

    @worker.readiness_probe(name="database")
    async def database() -> bool:
        return healthy

    @worker.task(timeout=5)
    async def handle(task_input: In, ctx: TaskContext) -> Out:
        return Out()

    transport = InMemoryTransport()
    runner = Runner(worker, settings(), transport)
    async with serving_probes(runner) as server:
        serving = asyncio.ensure_future(runner.serve())
        await until(lambda: transport.consuming, 5, "the runner to consume")
        assert (await request(server.port, "/ready")).status == 200
        healthy = False
        ready = await request(server.port, "/ready")
        assert ready.json()["components"] == {"database": "returned false"}
        runner.request_shutdown("test")
        await serving


async def test_a_busy_probes_port_is_a_settings_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = Worker("svc")

        @worker.task(timeout=5)
        async def handle(task_input: In, ctx: TaskContext) -> Out:
            return Out()

        runner = Runner(worker, settings(health_check_port=port), InMemoryTransport())
        with pytest.raises(SettingsError, match=f"cannot listen on 127.0.0.1:{port}"):
            async with serving_probes(runner):
                pass
