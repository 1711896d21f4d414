"""A worker's contract as an AsyncAPI 3.1 document (the ``asyncapi`` command prints it).

The document describes the worker as an application on RabbitMQ (docs/protocol.md)::

    asyncapi: "3.1.0"
    info:        title = the worker's name, version = the protocol version ("1")
    channels:
      input      address = the input queue; messages: envelope
      output     address = the output queue; messages: started, progress, success, failure
                 (each with an AMQP channel binding: a durable queue)
      control    the control exchange (a fanout: the routing key, the address, is ignored);
                 messages: cancel
    operations:
      receiveTask     receive on input (acked once its terminal report is confirmed)
      sendReports     send on output (persistent, mandatory, timestamped)
      receiveCancels  receive on control (optional in protocol version 1)
    components:
      messages   envelope, started, progress, success, failure, cancel: AMQP headers, the
                 AMQP message binding, and the AMQP properties under the protocol's names
                 (``x-amqp-properties``); failure also lists the error codes (``x-error-codes``)
      schemas    Envelope, InputRef, StartedReport, ProgressReport, SuccessReport,
                 FailureReport, ReportError, CancelRequest; and ``task.<Model>`` for the
                 task's input and output models (Envelope's ``input`` and SuccessReport's
                 ``response`` refer to them); each titled with its name (``TaskModel`` for
                 ``task.Model``), for code generators

The modules, one part each: ``document`` (the document, the queues, the envelope and the
reports), ``control`` (the control exchange, the cancel message and its operation),
``schemas`` (``components.schemas`` in AsyncAPI's dialect), ``bindings`` (what the AMQP
bindings share).

Where each part comes from, so that no rule is written twice: the queue names from
``WorkerSettings.in_queue``/``out_queue`` (``IN_QUEUE_NAME``/``OUT_QUEUE_NAME``, else
``<service>_queue_in``/``_out``), the control exchange's from
``WorkerSettings.control_exchange`` (``CONTROL_EXCHANGE_NAME``, else ``<service>_control``);
the envelope, report and cancel schemas from the shipped protocol schemas
(``protocol.schemas.load_schema``); the task's from pydantic's JSON Schema (input as
validated, output as serialized); the report properties' fixed values from
``protocol.reports.MessageProperties``; the control exchange's flags and the cancel's
properties from ``protocol.cancel``; the trace headers from ``observability.tracing``; the
SDK's codes, reserved or not, from ``protocol.codes``; the task's codes from
``@worker.task(errors=...)``.

AsyncAPI's default schema format is JSON Schema draft-07; the protocol's and pydantic's
schemas are draft 2020-12, so their few 2020-12-only forms (``$defs`` references,
``prefixItems``) are rewritten into draft-07 ones. For code generators (Modelina 5.10), a
``const`` that is not a string is written as a one-value ``enum``, and pydantic's OpenAPI-style
``discriminator`` is left out, as in the protocol's schemas (``schemas.draft07``).
"""

from __future__ import annotations

from async_task_api_worker.asyncapi.bindings import AMQP_BINDING_VERSION
from async_task_api_worker.asyncapi.document import ASYNCAPI_VERSION, asyncapi_document
from async_task_api_worker.asyncapi.schemas import TASK_SCHEMA_PREFIX

__all__ = ["AMQP_BINDING_VERSION", "ASYNCAPI_VERSION", "TASK_SCHEMA_PREFIX", "asyncapi_document"]
