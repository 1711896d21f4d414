"""The document: its info, the input and output queues, the envelope and the reports.

``async_task_api_worker.asyncapi`` has the document's shape, and where each part comes from.
"""

from __future__ import annotations

import inspect
from typing import Any, Final

from async_task_api_worker._version import __version__
from async_task_api_worker.asyncapi import control
from async_task_api_worker.asyncapi.bindings import AMQP_BINDING_VERSION, FIXED_PROPERTIES
from async_task_api_worker.asyncapi.schemas import SCHEMAS, component_schemas, summary
from async_task_api_worker.definition import TaskDefinition, Worker
from async_task_api_worker.observability.tracing import TRACE_HEADERS
from async_task_api_worker.protocol.cancel import CANCEL_TYPE
from async_task_api_worker.protocol.codes import RESERVED_ERROR_CODES, ErrorCode, ReportType
from async_task_api_worker.protocol.envelope import DELIVERY_COUNT_HEADER, PROTOCOL_VERSION
from async_task_api_worker.settings import WorkerSettings

__all__ = ["ASYNCAPI_VERSION", "asyncapi_document"]

#: The AsyncAPI version of the document: the latest 3.x, the one ``@asyncapi/parser`` asks for.
ASYNCAPI_VERSION: Final = "3.1.0"

_REPORT_SCHEMAS: Final = {
    ReportType.STARTED: "StartedReport",
    ReportType.PROGRESS: "ProgressReport",
    ReportType.SUCCESS: "SuccessReport",
    ReportType.FAILURE: "FailureReport",
}


def asyncapi_document(worker: Worker, settings: WorkerSettings) -> dict[str, Any]:
    """The AsyncAPI 3.1 document of ``worker``'s contract on RabbitMQ (the module's shape).

    Args:
        worker: the worker, with its task declared.
        settings: its settings: the queue names, the control exchange's name and the
            effective task timeout come from them.

    Returns:
        The document, a JSON-ready dict in a readable order (fresh on every call).

    Raises:
        NoTaskError: the worker has no task.
        ConfigError: pydantic cannot give the task's input or output model a JSON Schema.
    """
    task = worker.task_definition
    in_queue, out_queue = settings.in_queue(worker.name), settings.out_queue(worker.name)
    exchange = settings.control_exchange(worker.name)
    schemas, input_ref, output_ref = component_schemas(task)
    # The protocol's schemas say "any object" there; the task's models say which.
    schemas["Envelope"]["properties"]["input"] = {"$ref": input_ref}
    schemas["SuccessReport"]["properties"]["response"] = {"$ref": output_ref}
    for name in ("Envelope", *_REPORT_SCHEMAS.values()):
        # A worker refuses an envelope for another service, and signs its reports with its name.
        schemas[name]["properties"]["service"]["const"] = worker.name
    reports = [report.value for report in ReportType]
    timeout_s = settings.task_timeout_s(task.timeout_s)
    handler_doc = inspect.getdoc(task.handler)
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": worker.name,
            "version": str(PROTOCOL_VERSION),
            "description": (
                f"The worker service {worker.name}: it takes one task per envelope from "
                f"{in_queue} and publishes the task's reports to {out_queue}, and takes cancel "
                f"requests from the exchange {exchange} (AsyncTaskAPI protocol, version "
                f"{PROTOCOL_VERSION}). Written by async-task-api-worker {__version__}."
            ),
        },
        "defaultContentType": FIXED_PROPERTIES["content_type"],
        "channels": {
            "input": _channel(
                in_queue,
                "The input queue: one envelope per task, published by the producer through "
                "the default exchange (routing key: the queue's name).",
                ["envelope"],
            ),
            "output": _channel(
                out_queue,
                "The output queue: the reports of each task, in order, for one consumer.",
                reports,
            ),
            control.CONTROL_CHANNEL: control.control_channel(exchange),
        },
        "operations": {
            "receiveTask": {
                "action": "receive",
                "channel": {"$ref": "#/channels/input"},
                "title": f"Run {task.handler_reference}",
                "description": (f"{handler_doc}\n\n" if handler_doc else "")
                + (
                    f"Each task runs within {timeout_s:g} s. A delivery is acked only once its "
                    "terminal report is confirmed by the broker."
                ),
                "messages": [{"$ref": "#/channels/input/messages/envelope"}],
                "bindings": {"amqp": {"ack": True, "bindingVersion": AMQP_BINDING_VERSION}},
            },
            "sendReports": {
                "action": "send",
                "channel": {"$ref": "#/channels/output"},
                "title": "Report on each task",
                "description": (
                    "Per delivery: started, then progress updates, then one terminal report "
                    '(success or failure); see docs/protocol.md, "Reports".'
                ),
                "messages": [{"$ref": f"#/channels/output/messages/{name}"} for name in reports],
                "bindings": {
                    "amqp": {
                        "deliveryMode": FIXED_PROPERTIES["delivery_mode"],
                        "mandatory": True,
                        "timestamp": True,
                        "bindingVersion": AMQP_BINDING_VERSION,
                    }
                },
            },
            "receiveCancels": control.receive_cancels(),
        },
        "components": {
            "messages": {
                "envelope": _envelope_message(schemas["Envelope"]),
                **{
                    report.value: _report_message(report, schemas, worker.name, task)
                    for report in ReportType
                },
                CANCEL_TYPE: control.cancel_message(schemas[control.CANCEL_SCHEMA]),
            },
            "schemas": schemas,
        },
    }


def _channel(queue: str, description: str, messages: list[str]) -> dict[str, Any]:
    return {
        "address": queue,
        "title": queue,
        "description": description,
        "messages": {name: {"$ref": f"#/components/messages/{name}"} for name in messages},
        "bindings": {
            "amqp": {
                "is": "queue",
                # How the worker declares it when it does (durable, no arguments); a queue the
                # platform made first keeps its own arguments (a quorum queue, a limit).
                "queue": {"name": queue, "durable": True, "exclusive": False, "autoDelete": False},
                "bindingVersion": AMQP_BINDING_VERSION,
            }
        },
    }


def _headers(extra: dict[str, Any], whose: str) -> dict[str, Any]:
    trace = {
        name: {
            "type": "string",
            "description": f"W3C Trace Context ({name}): {whose}. Optional.",
        }
        for name in TRACE_HEADERS
    }
    return {"type": "object", "properties": {**extra, **trace}}


def _envelope_message(envelope: dict[str, Any]) -> dict[str, Any]:
    delivery_count = {
        DELIVERY_COUNT_HEADER: {
            "type": "integer",
            "minimum": 0,
            "description": (
                "Set by RabbitMQ on a quorum queue: how many times the message was delivered "
                "before (absent on the first delivery); the attempt is this count + 1. A "
                "producer must not set it."
            ),
        }
    }
    return {
        "name": "envelope",
        "title": "Task envelope",
        "summary": summary(envelope),
        "contentType": FIXED_PROPERTIES["content_type"],
        "headers": _headers(delivery_count, "the producer's span, which the worker continues"),
        "payload": {"$ref": f"{SCHEMAS}Envelope"},
        "correlationId": {
            "description": "The task id (also the AMQP message_id).",
            "location": "$message.payload#/task_id",
        },
        "bindings": {
            "amqp": {
                "bindingVersion": AMQP_BINDING_VERSION,
                "x-amqp-properties": {
                    "content_type": FIXED_PROPERTIES["content_type"],
                    "delivery_mode": FIXED_PROPERTIES["delivery_mode"],
                    "message_id": "<task_id>",
                },
            }
        },
    }


def _report_message(
    report: ReportType, schemas: dict[str, Any], service: str, task: TaskDefinition
) -> dict[str, Any]:
    schema_name = _REPORT_SCHEMAS[report]
    codes = _error_codes(task) if report is ReportType.FAILURE else None
    message: dict[str, Any] = {
        "name": report.value,
        "title": f"{report.value} report",
        "summary": summary(schemas[schema_name]),
        **({"description": _codes_text(codes)} if codes else {}),
        "contentType": FIXED_PROPERTIES["content_type"],
        "headers": _headers({}, "the span that published the report"),
        "payload": {"$ref": f"{SCHEMAS}{schema_name}"},
        "correlationId": {
            "description": "The task id (also the AMQP correlation_id).",
            "location": "$message.payload#/task_id",
        },
        "bindings": {
            "amqp": {
                "contentEncoding": FIXED_PROPERTIES["content_encoding"],
                "messageType": report.value,
                "bindingVersion": AMQP_BINDING_VERSION,
                # docs/protocol.md, "AMQP properties", in its order and with its names.
                "x-amqp-properties": {
                    "content_type": FIXED_PROPERTIES["content_type"],
                    "content_encoding": FIXED_PROPERTIES["content_encoding"],
                    "delivery_mode": FIXED_PROPERTIES["delivery_mode"],
                    "message_id": "<task_id>/<attempt>/<seq>",
                    "correlation_id": "<task_id>",
                    "type": report.value,
                    "timestamp": "<the report's timestamp, whole seconds since the Unix epoch>",
                    "app_id": service,
                },
            }
        },
    }
    if codes:
        message["x-error-codes"] = codes
    return message


def _error_codes(task: TaskDefinition) -> dict[str, dict[str, Any]]:
    """Every code known ahead: the SDK's (``sdk``: what it means), then the task's (``task``)."""
    codes: dict[str, dict[str, Any]] = {
        code.value: {"reserved": code.value in RESERVED_ERROR_CODES, "sdk": code.description}
        for code in ErrorCode
    }
    for code, description in task.errors.items():
        codes.setdefault(code, {"reserved": False})["task"] = description
    return codes


def _codes_text(codes: dict[str, dict[str, Any]]) -> str:
    lines = [
        "`error.code` is one of these, or another code the handler raises (codes are an open "
        "set: accept unknown ones). A reserved code comes from the SDK alone.",
        "",
    ]
    for code, entry in codes.items():
        whose = [label for key, label in (("sdk", "SDK"), ("task", "task")) if key in entry]
        if entry["reserved"]:
            whose.append("reserved")
        said = "; ".join(entry[key] for key in ("sdk", "task") if key in entry)
        lines.append(f"- `{code}` ({', '.join(whose)}): {said}")
    return "\n".join(lines)
