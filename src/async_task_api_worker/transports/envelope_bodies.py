"""What a transport whose message bodies are the protocol's envelope has in common.

RabbitMQ and the in-memory broker carry the AsyncTaskAPI envelope as the body
(``docs/protocol.md``, "The envelope"), keep a message until it is acked, and hold nothing for a
delivery beyond its settle. The SQS + Step Functions transport differs on all three and
implements them itself.
"""

from __future__ import annotations

from async_task_api_worker.ports import Delivery
from async_task_api_worker.protocol.envelope import Envelope, decode_envelope

__all__ = ["EnvelopeBodies"]


class EnvelopeBodies:
    """The envelope body, kept until acked, nothing to release (``ports.Transport``)."""

    @property
    def deletes_on_pickup(self) -> bool:
        """Never: a message stays in the queue until it is acked, and a requeue puts it back."""
        return False

    def envelope(self, delivery: Delivery, *, max_body_bytes: int) -> Envelope:
        """The body, decoded as the protocol's envelope (``decode_envelope``).

        Raises:
            EnvelopeDecodeError: the body is not a valid envelope.
        """
        return decode_envelope(delivery.body, max_body_bytes=max_body_bytes)

    async def release(self, delivery: Delivery) -> None:
        """Nothing is held for a delivery once it is settled."""
        return None
