"""The probes server of a real worker process: broker state, drain, probe hooks, bounds."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.observability.probes import IO_TIMEOUT_S, MAX_CONNECTIONS
from async_task_api_worker.runtime.hooks import shutdown_bound_s
from async_task_api_worker.settings import load_settings
from tests.integration.conftest import (
    BROKER_USER,
    Queues,
    _make_vhost,
    rabbitmqctl,
    wait_for,
)
from tests.probes_client import Answer, get, parse, request, request_bytes

TARGET = "tests.integration.observed_workers:observed"


def components(answer: Answer) -> dict[str, str]:
    assert answer.status == 503, answer
    assert answer.json()["status"] == "error"
    assert answer.json()["error"]["code"] == "NOT_READY"
    return dict(answer.json()["components"])


def ready_is(url: str, status: int, component: str | None = None) -> bool:
    answer = get(url, "/ready")
    if answer.status != status:
        return False
    return component is None or component in answer.json()["components"]


@pytest.fixture
def own_vhost(broker: None) -> Iterator[Queues]:
    """A vhost for this test alone (its permissions get cut)."""
    name = f"atw-probe-{uuid.uuid4().hex[:8]}"
    _make_vhost(name, quorum=True)
    yield Queues(name)
    rabbitmqctl("delete_vhost", name)


def test_health_answers_before_the_broker_connects(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    env = queues.env(BROKER_URL="amqp://guest:guest@127.0.0.1:1/", ATW_TEST_MARKERS=str(markers))
    worker = start_worker(TARGET, env, wait_connected=False)
    url = worker.probes_url
    assert get(url, "/health").status == 200
    assert components(get(url, "/ready")) == {"broker": "not connected yet"}
    assert "Connected to" not in worker.log()


def test_ready_follows_the_broker_connection(
    own_vhost: Queues, start_worker: Any, markers: Path
) -> None:
    worker = start_worker(TARGET, own_vhost.env(ATW_TEST_MARKERS=str(markers)))
    url = worker.probes_url
    wait_for(lambda: ready_is(url, 200), what="ready")
    # Cut the connection, and keep the reconnect refused while we look.
    rabbitmqctl("clear_permissions", "-p", own_vhost.vhost, BROKER_USER)
    rabbitmqctl("close_all_connections", "-p", own_vhost.vhost, "probes test")
    wait_for(lambda: ready_is(url, 503, "broker"), what="503 naming broker")
    assert get(url, "/health").status == 200
    rabbitmqctl("set_permissions", "-p", own_vhost.vhost, BROKER_USER, ".*", ".*", ".*")
    wait_for(lambda: ready_is(url, 200), timeout_s=60, what="ready after the reconnect")


def test_ready_says_draining_after_sigterm_while_health_stays_200(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    env = queues.env(ATW_TEST_MARKERS=str(markers), WORKER_SHUTDOWN_GRACE_S="60")
    worker = start_worker(TARGET, env)
    url = worker.probes_url

    async def submit() -> str:
        async with queues.client("observed") as client:
            return await client.submit({"mode": "wait"})

    task_id = asyncio.run(submit())
    wait_for((markers / f"started-{task_id}").exists, what="the task to start")
    signalled_at = time.monotonic()
    worker.signal(signal.SIGTERM)
    wait_for(lambda: ready_is(url, 503, "draining"), what="503 naming draining")
    assert get(url, "/health").status == 200
    (markers / "release").touch()
    bound_s = shutdown_bound_s(
        load_settings({"worker_shutdown_grace_s": 60}, read_environment=False)
    )
    assert worker.wait(timeout_s=bound_s) == 0
    assert time.monotonic() - signalled_at < bound_s
    assert "outcome=success action=ack" in worker.log()


def test_a_failing_readiness_probe_is_named(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    worker = start_worker(TARGET, queues.env(ATW_TEST_MARKERS=str(markers)))
    url = worker.probes_url
    wait_for(lambda: ready_is(url, 200), what="ready")
    (markers / "database-down").touch()
    assert components(get(url, "/ready")) == {"database": "returned false"}
    (markers / "database-down").unlink()
    assert get(url, "/ready").status == 200


def test_errors_use_the_platform_format(queues: Queues, start_worker: Any, markers: Path) -> None:
    worker = start_worker(TARGET, queues.env(ATW_TEST_MARKERS=str(markers)))
    url = worker.probes_url
    missing = get(url, "/nope")
    assert missing.status == 404
    assert missing.json() == {
        "status": "error",
        "error": {
            "code": "NOT_FOUND",
            "message": "no such path; the paths are /health, /ready and /metrics",
        },
    }
    refused = get(url, "/ready", method="DELETE")
    assert refused.status == 405
    assert refused.json() == {
        "status": "error",
        "error": {"code": "METHOD_NOT_ALLOWED", "message": "/ready answers GET and HEAD only"},
    }


async def test_connections_past_32_are_closed_at_once_and_idle_ones_after_5_s(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    worker = start_worker(TARGET, queues.env(ATW_TEST_MARKERS=str(markers)))
    port = int(worker.probes_url.rsplit(":", 1)[1])
    started = time.monotonic()
    opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(MAX_CONNECTIONS + 8)]

    async def closed_after(reader: asyncio.StreamReader) -> float:
        with contextlib.suppress(ConnectionError):
            await reader.read()
        return time.monotonic() - started

    waits = await asyncio.gather(*(closed_after(reader) for reader, _ in opened))
    for _, writer in opened:
        writer.close()
    at_once = [w for w in waits if w < IO_TIMEOUT_S / 2]
    held = [w for w in waits if w >= IO_TIMEOUT_S]
    assert len(at_once) == 8, waits
    assert len(held) == MAX_CONNECTIONS, waits
    # The read times out after IO_TIMEOUT_S; the close then takes at most IO_TIMEOUT_S more.
    assert max(held) <= 2 * IO_TIMEOUT_S + 1.0
    assert (await request(port, "/health")).status == 200


async def test_concurrent_ready_calls_run_the_probe_hooks_once(
    queues: Queues, start_worker: Any, markers: Path
) -> None:
    worker = start_worker(TARGET, queues.env(ATW_TEST_MARKERS=str(markers)))
    url = worker.probes_url
    port = int(url.rsplit(":", 1)[1])
    wait_for(lambda: ready_is(url, 200), what="ready")
    calls = markers / "probe-calls"
    calls.unlink()
    hold = markers / "probe-hold"
    hold.touch()
    asks = 50
    refused = 0
    all_refused = asyncio.Event()

    async def ask() -> Answer | None:
        nonlocal refused
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(request_bytes("GET", "/ready"))
            await writer.drain()
            return parse(await reader.read())
        except (ConnectionError, IndexError, ValueError):
            refused += 1  # past the connection limit: closed at once
            if refused == asks - MAX_CONNECTIONS:
                all_refused.set()
            return None
        finally:
            writer.close()

    async def release() -> None:
        # The server closes a connection past the limit when it accepts it, after the ones it
        # serves: once every one past it is closed, all 50 were accepted and the served ones
        # are read in the loop's next turn, before the held hook can end. They share it.
        await all_refused.wait()
        hold.unlink()

    *answers, _ = await asyncio.gather(*(ask() for _ in range(asks)), release())
    served = [answer for answer in answers if answer is not None and answer.status]
    assert len(served) >= MAX_CONNECTIONS
    assert {answer.status for answer in served} == {200}
    assert calls.read_text().count("call") == 1
