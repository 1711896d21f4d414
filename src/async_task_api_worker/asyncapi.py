"""A worker's contract as an AsyncAPI 3.0 document (the ``asyncapi`` command prints it).

The document describes the worker as an application on RabbitMQ (docs/protocol.md)::

    asyncapi: "3.0.0"
    info:        title = the worker's name, version = the protocol version ("1")
    channels:
      input      address = the input queue; messages: envelope
      output     address = the output queue; messages: started, progress, success, failure
                 (each with an AMQP channel binding: a durable queue)
    operations:
      receiveTask    receive on input (acked once its terminal report is confirmed)
      sendReports    send on output (persistent, mandatory, timestamped)
    components:
      messages   envelope, started, progress, success, failure: AMQP headers, the AMQP
                 message binding, and the AMQP properties under the protocol's names
                 (``x-amqp-properties``); failure also lists the error codes (``x-error-codes``)
      schemas    Envelope, InputRef, StartedReport, ProgressReport, SuccessReport,
                 FailureReport, ReportError; and ``task.<Model>`` for the task's input and
                 output models (Envelope's ``input`` and SuccessReport's ``response`` refer to
                 them)

Where each part comes from, so that no rule is written twice: the queue names from
``WorkerSettings.in_queue``/``out_queue`` (``IN_QUEUE_NAME``/``OUT_QUEUE_NAME``, else
``<service>_queue_in``/``_out``); the envelope and report schemas from the shipped protocol
schemas (``protocol.schemas.load_schema``); the task's from pydantic's JSON Schema (input as
validated, output as serialized); the report properties' fixed values from
``protocol.reports.MessageProperties``; the trace headers from ``observability.tracing``; the
SDK's codes, reserved or not, from ``protocol.codes``; the task's codes from
``@worker.task(errors=...)``.

AsyncAPI's default schema format is JSON Schema draft-07 (with ``discriminator`` a property
name); the protocol's and pydantic's schemas are draft 2020-12, so their few 2020-12-only
forms (``$defs`` references, ``prefixItems``, an OpenAPI-style ``discriminator`` object) are
rewritten into draft-07 ones.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Final

from pydantic.errors import PydanticInvalidForJsonSchema
from pydantic.json_schema import models_json_schema

from async_task_api_worker._version import __version__
from async_task_api_worker.definition import TaskDefinition, Worker
from async_task_api_worker.errors import ConfigError
from async_task_api_worker.observability.tracing import TRACE_HEADERS
from async_task_api_worker.protocol.codes import RESERVED_ERROR_CODES, ErrorCode, ReportType
from async_task_api_worker.protocol.envelope import DELIVERY_COUNT_HEADER, PROTOCOL_VERSION
from async_task_api_worker.protocol.reports import MessageProperties
from async_task_api_worker.protocol.schemas import load_schema
from async_task_api_worker.settings import WorkerSettings

__all__ = ["ASYNCAPI_VERSION", "TASK_SCHEMA_PREFIX", "asyncapi_document"]

#: The AsyncAPI version of the document.
ASYNCAPI_VERSION: Final = "3.0.0"
#: The AMQP bindings' version (channel, operation and message bindings).
AMQP_BINDING_VERSION: Final = "0.3.0"
#: The prefix of the task's own schemas among ``components.schemas``: none of the protocol's
#: names has it, so a task model named ``Envelope`` or ``InputRef`` cannot clash.
TASK_SCHEMA_PREFIX: Final = "task."

_SCHEMAS: Final = "#/components/schemas/"
_REPORT_SCHEMAS: Final = {
    ReportType.STARTED: "StartedReport",
    ReportType.PROGRESS: "ProgressReport",
    ReportType.SUCCESS: "SuccessReport",
    ReportType.FAILURE: "FailureReport",
}
# The fixed values of a report's AMQP properties (content type, encoding, delivery mode).
_FIXED_PROPERTIES: Final = {
    item.name: item.default
    for item in dataclasses.fields(MessageProperties)
    if item.default is not dataclasses.MISSING
}


def asyncapi_document(worker: Worker, settings: WorkerSettings) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of ``worker``'s contract on RabbitMQ (the module's shape).

    Args:
        worker: the worker, with its task declared.
        settings: its settings: the queue names and the effective task timeout come from them.

    Returns:
        The document, a JSON-ready dict in a readable order (fresh on every call).

    Raises:
        NoTaskError: the worker has no task.
        ConfigError: pydantic cannot give the task's input or output model a JSON Schema.
    """
    task = worker.task_definition
    in_queue, out_queue = settings.in_queue(worker.name), settings.out_queue(worker.name)
    schemas, input_ref, output_ref = _schemas(task)
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
                f"{in_queue} and publishes the task's reports to {out_queue} (AsyncTaskAPI "
                f"protocol, version {PROTOCOL_VERSION}). Written by async-task-api-worker "
                f"{__version__}."
            ),
        },
        "defaultContentType": _FIXED_PROPERTIES["content_type"],
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
                        "deliveryMode": _FIXED_PROPERTIES["delivery_mode"],
                        "mandatory": True,
                        "timestamp": True,
                        "bindingVersion": AMQP_BINDING_VERSION,
                    }
                },
            },
        },
        "components": {
            "messages": {
                "envelope": _envelope_message(schemas["Envelope"]),
                **{
                    report.value: _report_message(report, schemas, worker.name, task)
                    for report in ReportType
                },
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


def _summary(schema: dict[str, Any]) -> str:
    return str(schema.get("description", "")).split("\n", 1)[0]


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
        "summary": _summary(envelope),
        "contentType": _FIXED_PROPERTIES["content_type"],
        "headers": _headers(delivery_count, "the producer's span, which the worker continues"),
        "payload": {"$ref": f"{_SCHEMAS}Envelope"},
        "correlationId": {
            "description": "The task id (also the AMQP message_id).",
            "location": "$message.payload#/task_id",
        },
        "bindings": {
            "amqp": {
                "bindingVersion": AMQP_BINDING_VERSION,
                "x-amqp-properties": {
                    "content_type": _FIXED_PROPERTIES["content_type"],
                    "delivery_mode": _FIXED_PROPERTIES["delivery_mode"],
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
        "summary": _summary(schemas[schema_name]),
        **({"description": _codes_text(codes)} if codes else {}),
        "contentType": _FIXED_PROPERTIES["content_type"],
        "headers": _headers({}, "the span that published the report"),
        "payload": {"$ref": f"{_SCHEMAS}{schema_name}"},
        "correlationId": {
            "description": "The task id (also the AMQP correlation_id).",
            "location": "$message.payload#/task_id",
        },
        "bindings": {
            "amqp": {
                "contentEncoding": _FIXED_PROPERTIES["content_encoding"],
                "messageType": report.value,
                "bindingVersion": AMQP_BINDING_VERSION,
                # docs/protocol.md, "AMQP properties", in its order and with its names.
                "x-amqp-properties": {
                    "content_type": _FIXED_PROPERTIES["content_type"],
                    "content_encoding": _FIXED_PROPERTIES["content_encoding"],
                    "delivery_mode": _FIXED_PROPERTIES["delivery_mode"],
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


def _schemas(task: TaskDefinition) -> tuple[dict[str, Any], str, str]:
    """``components.schemas``, and the references of the task's input and output schemas."""
    schemas: dict[str, Any] = {}
    envelope, report = load_schema("envelope"), load_schema("report")
    for source in (envelope, report):
        schemas.update(source.pop("$defs", {}))
    # The report schema's root is only a oneOf of the four: each report is its own message.
    for key in ("$id", "$schema"):  # an $id would move the base that references resolve on
        envelope.pop(key, None)
    schemas["Envelope"] = envelope
    try:
        refs, top = models_json_schema(
            [(task.input_model, "validation"), (task.output_model, "serialization")],
            ref_template=f"{_SCHEMAS}{TASK_SCHEMA_PREFIX}{{model}}",
        )
    except PydanticInvalidForJsonSchema as exc:
        first_line = str(exc).split("\n", 1)[0]
        raise ConfigError(
            f"the task's models ({task.input_model.__name__}, {task.output_model.__name__}) "
            f"have no JSON Schema: {first_line}"
        ) from exc
    for name, schema in top.get("$defs", {}).items():
        schemas[f"{TASK_SCHEMA_PREFIX}{name}"] = schema
    converted = {name: _draft07(schema) for name, schema in schemas.items()}
    return (
        converted,
        refs[(task.input_model, "validation")]["$ref"],
        refs[(task.output_model, "serialization")]["$ref"],
    )


# Keywords whose values are schemas: a map of them, a list of them, or one (or a list: items).
_SCHEMA_MAPS: Final = frozenset(
    {"properties", "patternProperties", "definitions", "$defs", "dependentSchemas"}
)
_SCHEMA_LISTS: Final = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_ONES: Final = frozenset(
    {"items", "additionalItems", "additionalProperties", "not", "if", "then", "else"}
    | {"contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties"}
)


def _draft07(schema: Any) -> Any:
    """``schema`` (JSON Schema 2020-12) in AsyncAPI's draft-07 dialect, references moved.

    Only keywords are rewritten, never values (a ``default`` or an ``example`` that happens to
    hold a ``$ref`` key stays as it is): the walk follows the keywords that hold schemas.
    """
    if not isinstance(schema, dict):
        return schema  # true / false
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/"):
            out[key] = _SCHEMAS + value.removeprefix("#/$defs/")
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _draft07(item) for name, item in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_draft07(item) for item in value]
        elif key in _SCHEMA_ONES:
            out[key] = (
                [_draft07(item) for item in value] if isinstance(value, list) else _draft07(value)
            )
        elif key == "discriminator" and isinstance(value, dict):
            # OpenAPI's object (pydantic's discriminated unions); AsyncAPI wants the name.
            if isinstance(value.get("propertyName"), str):
                out[key] = value["propertyName"]
        else:
            out[key] = value
    if "prefixItems" in out:  # draft-07 writes a tuple as a list of items
        rest = out.pop("items", None)
        out["items"] = out.pop("prefixItems")
        if rest is not None:
            out["additionalItems"] = rest
    return out
