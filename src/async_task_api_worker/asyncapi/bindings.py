"""What the document's AMQP bindings share: their version, and the reports' fixed properties."""

from __future__ import annotations

import dataclasses
from typing import Final

from async_task_api_worker.protocol.reports import MessageProperties

__all__ = ["AMQP_BINDING_VERSION", "FIXED_PROPERTIES"]

#: The AMQP bindings' version (channel, operation and message bindings).
AMQP_BINDING_VERSION: Final = "0.3.0"

#: The fixed values of a message's AMQP properties (content type, encoding, delivery mode):
#: ``MessageProperties``' defaults. A cancel request has its own delivery mode.
FIXED_PROPERTIES: Final = {
    item.name: item.default
    for item in dataclasses.fields(MessageProperties)
    if item.default is not dataclasses.MISSING
}
