"""The probes server over real sockets, in process: answers, error format, bounds, sharing."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from async_task_api_worker.observability.probes import (
    IO_TIMEOUT_S,
    MAX_CONNECTIONS,
    MAX_REQUEST_BYTES,
    ProbesServer,
    ReadinessCheck,
)
from tests.polling import until
from tests.probes_client import Answer, parse, request

ServerFactory = Callable[..., Awaitable[ProbesServer]]


def metrics_body(accept: str | None) -> tuple[bytes, str]:
    return b"worker_up 1\n", "text/plain; version=0.0.4; charset=utf-8"


@pytest.fixture
async def serve() -> AsyncIterator[ServerFactory]:
    started: list[ProbesServer] = []

    async def start(
        builtin: Callable[[], dict[str, str]] = dict,
        probes: dict[str, Callable[[], Awaitable[object]]] | None = None,
        **options: float,
    ) -> ProbesServer:
        probe_timeout_s = options.pop("probe_timeout_s", 3.0)
        server = ProbesServer(
            host="127.0.0.1",
            port=0,
            readiness=ReadinessCheck(builtin, probes or {}, probe_timeout_s=probe_timeout_s),
            metrics=metrics_body,
            **options,  # type: ignore[arg-type]
        )
        await server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        await server.close()


def assert_error(answer: Answer, status: int, code: str) -> None:
    assert answer.status == status
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert body["status"] == "error"
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


async def test_health_and_ready_answer_200(serve: ServerFactory) -> None:
    server = await serve()
    health = await request(server.port, "/health")
    assert (health.status, health.json()) == (200, {"status": "ok"})
    ready = await request(server.port, "/ready?verbose=1")
    assert (ready.status, ready.json()) == (200, {"status": "ready"})
    assert health.headers["connection"] == "close"
    assert health.headers["content-length"] == str(len(health.body))


async def test_metrics_are_served_with_their_content_type(serve: ServerFactory) -> None:
    server = await serve()
    answer = await request(server.port, "/metrics")
    assert answer.status == 200
    assert answer.body == b"worker_up 1\n"
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")


async def test_head_answers_the_headers_without_the_body(serve: ServerFactory) -> None:
    server = await serve()
    answer = await request(server.port, "/health", method="HEAD")
    assert answer.status == 200
    assert answer.body == b""
    assert int(answer.headers["content-length"]) > 0


async def test_ready_names_the_failing_builtin_components(serve: ServerFactory) -> None:
    server = await serve(builtin=lambda: {"broker": "not connected", "draining": "stopping"})
    answer = await request(server.port, "/ready")
    assert_error(answer, 503, "NOT_READY")
    assert answer.json()["components"] == {"broker": "not connected", "draining": "stopping"}
    assert "broker" in answer.json()["error"]["message"]


async def test_a_probe_that_returns_false_raises_or_hangs_is_named(
    serve: ServerFactory,
) -> None:
    async def ok() -> bool:
        return True

    async def database() -> bool:
        return False

    async def cache() -> bool:
        raise ConnectionError("redis://user:hunter2@cache failed")

    async def slow() -> bool:
        await asyncio.sleep(60)
        return True

    server = await serve(
        probes={"ok": ok, "database": database, "cache": cache, "slow": slow},
        probe_timeout_s=0.2,
    )
    answer = await request(server.port, "/ready")
    assert_error(answer, 503, "NOT_READY")
    components = answer.json()["components"]
    assert components == {
        "cache": "raised ConnectionError",
        "database": "returned false",
        "slow": "no answer within 0.2 s",
    }
    assert b"hunter2" not in answer.body


async def test_unknown_path_is_404_and_other_methods_405(serve: ServerFactory) -> None:
    server = await serve()
    assert_error(await request(server.port, "/nope"), 404, "NOT_FOUND")
    refused = await request(server.port, "/health", method="POST")
    assert_error(refused, 405, "METHOD_NOT_ALLOWED")
    assert refused.headers["allow"] == "GET, HEAD"


async def test_a_malformed_request_is_400(serve: ServerFactory) -> None:
    server = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"hello\r\n\r\n")
    assert_error(parse(await reader.read()), 400, "BAD_REQUEST")
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /health SPDY/3\r\n\r\n")
    assert_error(parse(await reader.read()), 400, "BAD_REQUEST")
    writer.close()


async def test_a_probe_evaluation_that_fails_is_500_probe_failed(serve: ServerFactory) -> None:
    def broken() -> dict[str, str]:
        raise RuntimeError("bug")

    server = await serve(builtin=broken)
    assert_error(await request(server.port, "/ready"), 500, "PROBE_FAILED")
    assert (await request(server.port, "/health")).status == 200


async def test_a_header_flood_gets_400_without_being_buffered(serve: ServerFactory) -> None:
    server = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /health HTTP/1.1\r\n" + b"X-Flood: " + b"a" * (4 * MAX_REQUEST_BYTES))
    answer = parse(await asyncio.wait_for(reader.read(), timeout=IO_TIMEOUT_S))
    assert_error(answer, 400, "BAD_REQUEST")
    writer.close()


async def test_a_body_is_never_read_and_the_answer_still_comes(serve: ServerFactory) -> None:
    server = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /health HTTP/1.1\r\nContent-Length: 100000000\r\n\r\n" + b"x" * 65536)
    answer = parse(await asyncio.wait_for(reader.read(), timeout=IO_TIMEOUT_S))
    assert answer.status == 200
    writer.close()


async def test_connections_past_the_limit_are_closed_at_once_and_idle_ones_time_out(
    serve: ServerFactory,
) -> None:
    io_timeout_s = 0.5
    server = await serve(io_timeout_s=io_timeout_s)
    started = time.monotonic()
    opened = [
        await asyncio.open_connection("127.0.0.1", server.port) for _ in range(MAX_CONNECTIONS + 8)
    ]

    async def closed_after(reader: asyncio.StreamReader) -> float:
        with contextlib.suppress(ConnectionError):  # closed at once may mean reset
            await reader.read()
        return time.monotonic() - started

    waits = await asyncio.gather(*(closed_after(reader) for reader, _ in opened))
    quick = [w for w in waits if w < io_timeout_s / 2]
    held = [w for w in waits if w >= io_timeout_s]
    assert len(quick) == 8
    assert len(held) == MAX_CONNECTIONS
    # Read, then close: each bounded by io_timeout_s.
    assert max(held) < 2 * io_timeout_s + 0.5
    for _, writer in opened:
        writer.close()
    assert (await request(server.port, "/health")).status == 200


async def test_concurrent_ready_requests_share_one_evaluation(serve: ServerFactory) -> None:
    calls = 0
    release = asyncio.Event()

    async def database() -> bool:
        nonlocal calls
        calls += 1
        await release.wait()
        return True

    server = await serve(probes={"database": database})
    readiness = server.readiness
    asking = [asyncio.ensure_future(request(server.port, "/ready")) for _ in range(20)]
    # every request is waiting on the evaluation in progress
    await until(lambda: readiness.waiting == 20, 5, "20 requests waiting")
    release.set()
    answers = await asyncio.gather(*asking)
    assert [a.status for a in answers] == [200] * 20
    assert calls == 1
    release.clear()
    second = asyncio.ensure_future(request(server.port, "/ready"))
    await until(lambda: readiness.waiting == 1, 5, "the request waiting")
    release.set()
    assert (await second).status == 200
    assert calls == 2  # a later request evaluates again


async def test_close_cuts_the_connections_being_served(serve: ServerFactory) -> None:
    server = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    await until(lambda: server.connections == 1, 5, "the connection served")
    await asyncio.wait_for(server.close(), timeout=1.0)
    assert await asyncio.wait_for(reader.read(), timeout=1.0) == b""
    writer.close()
    await server.close()  # idempotent


async def test_a_busy_port_raises_oserror(serve: ServerFactory) -> None:
    first = await serve()
    second = ProbesServer(
        host="127.0.0.1", port=first.port, readiness=ReadinessCheck(dict, {}), metrics=metrics_body
    )
    with pytest.raises(OSError):
        await second.start()


@pytest.mark.parametrize(
    "raised", [SystemExit(0), KeyboardInterrupt(), asyncio.CancelledError(), GeneratorExit()]
)
async def test_a_probe_raising_a_base_exception_is_named_not_fatal(
    serve: ServerFactory, raised: BaseException
) -> None:
    async def database() -> bool:
        raise raised

    server = await serve(probes={"database": database})
    answer = await request(server.port, "/ready")
    assert answer.json()["components"] == {"database": f"raised {type(raised).__name__}"}
    assert (await request(server.port, "/health")).status == 200


async def test_a_probe_ignoring_its_cancel_does_not_hold_the_answer(serve: ServerFactory) -> None:
    release = asyncio.Event()

    async def stubborn() -> bool:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()
        return True

    server = await serve(probes={"stubborn": stubborn}, probe_timeout_s=0.1)
    answer = await request(server.port, "/ready")
    assert answer.json()["components"] == {"stubborn": "no answer within 0.1 s"}
    assert server.readiness.stuck_probes == 1
    release.set()
    await until(lambda: server.readiness.stuck_probes == 0, 5, "the stuck probe to end")


async def test_a_probe_whose_truth_value_raises_is_named(serve: ServerFactory) -> None:
    class Weird:
        def __bool__(self) -> bool:
            raise ValueError("no truth")

    async def odd() -> object:
        return Weird()

    server = await serve(probes={"odd": odd})
    assert (await request(server.port, "/ready")).json()["components"] == {
        "odd": "raised ValueError"
    }


async def test_nothing_from_the_request_reaches_the_answer_headers(serve: ServerFactory) -> None:
    server = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(
        b"GET /metrics HTTP/1.1\r\n"
        b"Accept: application/openmetrics-text; version=2.0\nSet-Cookie: pwned=1\r\n\r\n"
    )
    raw = await reader.read()
    writer.close()
    head = raw.partition(b"\r\n\r\n")[0]
    assert b"pwned" not in head
    assert parse(raw).status == 200


async def test_an_absolute_form_target_is_served(serve: ServerFactory) -> None:
    server = await serve()
    assert (await request(server.port, "http://probes:8083/health")).status == 200
