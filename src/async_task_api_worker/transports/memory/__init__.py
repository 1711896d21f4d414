"""An in-memory broker and transport: a real :class:`~async_task_api_worker.ports.Transport`.

It behaves like a RabbitMQ quorum queue where it matters to the engine: each message has a
delivery count (``x-delivery-count``, absent on the first delivery), a requeue puts it back at
the head, a prefetch bounds the unacked deliveries, a queue delivery limit drops a message to
the dead letters, publishes are confirmed (or fail, on request). With ``count_deliveries=False``
it behaves like a classic queue: only the redelivered flag is set.

It backs the test harness and the ``dev`` command, and runs the same engine as production.
"""

from async_task_api_worker.transports.memory.broker import InMemoryTransport
from async_task_api_worker.transports.memory.messages import (
    DeadLetter,
    MemoryDelivery,
    PublishedReport,
    QueuedMessage,
)

__all__ = ["DeadLetter", "InMemoryTransport", "MemoryDelivery", "PublishedReport", "QueuedMessage"]
