"""The control channel: the service's control exchange, the cancel message, its operation.

docs/protocol.md, "Cancelling a task": clients publish cancel requests to a fanout exchange
(``WorkerSettings.control_exchange``), which copies each to every worker bound to it. Its
flags, the message's properties and the failure a cancel concludes with are
``protocol.cancel``'s and ``protocol.codes``'; the payload is the shipped cancel schema.
"""

from __future__ import annotations

from typing import Any, Final

from async_task_api_worker.asyncapi.bindings import AMQP_BINDING_VERSION, FIXED_PROPERTIES
from async_task_api_worker.asyncapi.schemas import SCHEMAS, summary
from async_task_api_worker.protocol.cancel import (
    CANCEL_DELIVERY_MODE,
    CANCEL_TYPE,
    CONTROL_EXCHANGE_AUTO_DELETE,
    CONTROL_EXCHANGE_DURABLE,
    CONTROL_EXCHANGE_TYPE,
    MAX_CANCEL_BYTES,
    TASK_CANCELLED_MESSAGE,
    cancel_message_id,
)
from async_task_api_worker.protocol.codes import ErrorCode, ReportType

__all__ = [
    "CANCEL_SCHEMA",
    "CONTROL_CHANNEL",
    "cancel_message",
    "control_channel",
    "receive_cancels",
]

#: The channel's and the schema's keys in the document.
CONTROL_CHANNEL: Final = "control"
CANCEL_SCHEMA: Final = "CancelRequest"


def control_channel(exchange: str) -> dict[str, Any]:
    """The channel of the control exchange ``exchange`` (an AMQP ``routingKey`` channel)."""
    return {
        # A routingKey channel's address is the routing key: a fanout ignores it, and this
        # SDK's clients publish with an empty one.
        "address": "",
        "title": exchange,
        "description": (
            f"The control exchange: a {CONTROL_EXCHANGE_TYPE} exchange that copies each cancel "
            "request to every worker of the service bound to it at that moment (the routing "
            "key is ignored). Clients and workers declare it with exactly these flags and no "
            "arguments."
        ),
        "messages": {CANCEL_TYPE: {"$ref": f"#/components/messages/{CANCEL_TYPE}"}},
        "bindings": {
            "amqp": {
                "is": "routingKey",
                "exchange": {
                    "name": exchange,
                    "type": CONTROL_EXCHANGE_TYPE,
                    "durable": CONTROL_EXCHANGE_DURABLE,
                    "autoDelete": CONTROL_EXCHANGE_AUTO_DELETE,
                },
                "bindingVersion": AMQP_BINDING_VERSION,
            }
        },
    }


def cancel_message(schema: dict[str, Any]) -> dict[str, Any]:
    """The cancel message; ``schema`` is its payload's (``components.schemas``)."""
    return {
        "name": CANCEL_TYPE,
        "title": "Cancel request",
        "summary": summary(schema),
        "description": (
            f"At most {MAX_CANCEL_BYTES:,} bytes, in the canonical encoding; unknown fields are "
            "ignored. Published with no headers."
        ),
        "contentType": FIXED_PROPERTIES["content_type"],
        "payload": {"$ref": f"{SCHEMAS}{CANCEL_SCHEMA}"},
        "correlationId": {
            "description": "The task to cancel (also the AMQP correlation_id).",
            "location": "$message.payload#/task_id",
        },
        "bindings": {
            "amqp": {
                "contentEncoding": FIXED_PROPERTIES["content_encoding"],
                "messageType": CANCEL_TYPE,
                "bindingVersion": AMQP_BINDING_VERSION,
                # docs/protocol.md, "Cancelling a task", in its order and with its names.
                "x-amqp-properties": {
                    "content_type": FIXED_PROPERTIES["content_type"],
                    "content_encoding": FIXED_PROPERTIES["content_encoding"],
                    "delivery_mode": CANCEL_DELIVERY_MODE,
                    "message_id": cancel_message_id("<task_id>"),
                    "correlation_id": "<task_id>",
                    "type": CANCEL_TYPE,
                    "timestamp": (
                        "<the request's timestamp, whole seconds since the Unix epoch, "
                        "rounded down>"
                    ),
                    "app_id": "<client_id>",
                },
            }
        },
    }


def receive_cancels() -> dict[str, Any]:
    """The worker's ``receive`` of cancel requests."""
    failure, code = ReportType.FAILURE.value, ErrorCode.TASK_CANCELLED.value
    return {
        "action": "receive",
        "channel": {"$ref": f"#/channels/{CONTROL_CHANNEL}"},
        "title": "Cancel a task",
        "description": (
            "Optional in protocol version 1: a worker that does not implement cancels is still "
            "a valid v1 worker (it binds no queue to the exchange, and its tasks run to their "
            "end). This worker binds an exclusive, auto-delete queue of its own to the "
            "exchange, and so receives every cancel request of its service.\n\n"
            f"A cancel concludes its task with exactly one terminal report, a {failure} with "
            f'code {code} ("{TASK_CANCELLED_MESSAGE}"): at once when the task runs on this '
            "worker, or without running when its delivery comes while the request is "
            "remembered. A task already concluded keeps its report. A cancel may lose the "
            "race or be lost, so the client waits for the terminal report as usual; see "
            'docs/protocol.md, "Cancelling a task".'
        ),
        "messages": [{"$ref": f"#/channels/{CONTROL_CHANNEL}/messages/{CANCEL_TYPE}"}],
        "bindings": {
            "amqp": {"deliveryMode": CANCEL_DELIVERY_MODE, "bindingVersion": AMQP_BINDING_VERSION}
        },
    }
