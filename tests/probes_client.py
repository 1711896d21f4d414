"""A minimal HTTP client for the probes tests: raw sockets, so nothing is hidden or retried."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def parse(raw: bytes) -> Answer:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(status_line.split(" ")[1]), headers, body)


def request_bytes(method: str, path: str, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: probes"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def request(
    port: int,
    path: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    host: str = "127.0.0.1",
) -> Answer:
    """Send one request and read the answer until the server closes."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request_bytes(method, path, headers))
        await writer.drain()
        return parse(await reader.read())
    finally:
        writer.close()


def get(url: str, path: str, method: str = "GET", timeout_s: float = 10.0) -> Answer:
    """Blocking version of :func:`request` for ``url`` = ``http://HOST:PORT``."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(request_bytes(method, path))
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return parse(b"".join(chunks))
