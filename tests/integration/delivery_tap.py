"""What a broker delivered to a worker, read from the frames a ``TcpProxy`` forwards.

Used by ``tests/integration/test_attempt_counting_on_rabbitmq.py``.
"""

from __future__ import annotations

import threading
from typing import Any

from pamqp import commands, frame, header


class DeliveryTap:
    """Reads the AMQP frames a broker sends through a :class:`TcpProxy`: every delivery's
    ``redelivered`` and headers, per queue, in order."""

    def __init__(self) -> None:
        self._buffers: dict[int, bytes] = {}
        self._pending: dict[tuple[int, int], commands.Basic.Deliver] = {}
        self._lock = threading.Lock()
        self.deliveries: list[tuple[str, bool, dict[str, Any]]] = []

    def __call__(self, connection: int, data: bytes) -> None:
        buffer = self._buffers.get(connection, b"") + data
        while len(buffer) >= 7:
            size = int.from_bytes(buffer[3:7], "big")
            if len(buffer) < size + 8:
                break
            _, channel, read = frame.unmarshal(buffer[: size + 8])
            buffer = buffer[size + 8 :]
            if isinstance(read, commands.Basic.Deliver):
                self._pending[(connection, channel)] = read
            elif isinstance(read, header.ContentHeader):
                deliver = self._pending.pop((connection, channel), None)
                if deliver is not None:
                    with self._lock:
                        headers = dict(read.properties.headers or {})
                        self.deliveries.append(
                            (str(deliver.routing_key), deliver.redelivered, headers)
                        )
        self._buffers[connection] = buffer

    def of(self, queue: str) -> list[tuple[bool, dict[str, Any]]]:
        """The deliveries from ``queue`` so far: ``(redelivered, headers)``."""
        with self._lock:
            return [(again, headers) for name, again, headers in self.deliveries if name == queue]
