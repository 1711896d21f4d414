"""The AsyncAPI document of a worker, and the ``asyncapi`` command that prints it."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker import Worker
from async_task_api_worker.asyncapi import asyncapi_document
from async_task_api_worker.cli import main
from async_task_api_worker.cli.main import CLOSED_STDOUT
from async_task_api_worker.errors import ConfigError, NoTaskError
from async_task_api_worker.protocol.cancel import encode_cancel
from async_task_api_worker.protocol.codes import RESERVED_ERROR_CODES, ErrorCode
from async_task_api_worker.protocol.schemas import load_schema
from async_task_api_worker.settings import WorkerSettings, load_settings
from examples.count_words import worker as count_words
from tests.unit.asyncapi.asyncapi_workers import rich, unschemable

REPO = Path(__file__).resolve().parents[3]
REPORTS = ["started", "progress", "success", "failure"]


def settings(**values: Any) -> WorkerSettings:
    return load_settings(values, read_environment=False)


@pytest.fixture
def document() -> dict[str, Any]:
    return asyncapi_document(count_words, settings())


def resolve(document: dict[str, Any], ref: str) -> Any:
    """The value a local ``$ref`` (``#/a/b``) points at, or KeyError."""
    value: Any = document
    for part in ref.removeprefix("#/").split("/"):
        value = value[part.replace("~1", "/").replace("~0", "~")]
    return value


def refs_in(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "$ref" and isinstance(item, str):
                yield item
            else:
                yield from refs_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from refs_in(item)


def test_the_queues_are_the_channels_with_their_amqp_bindings(document: dict[str, Any]) -> None:
    assert document["asyncapi"] == "3.1.0"
    assert document["info"]["title"] == "count-words"
    channels = document["channels"]
    assert [channels[name]["address"] for name in ("input", "output")] == [
        "count-words_queue_in",
        "count-words_queue_out",
    ]
    binding = channels["input"]["bindings"]["amqp"]
    assert binding["is"] == "queue"
    assert binding["queue"]["name"] == "count-words_queue_in"
    assert binding["queue"]["durable"] is True
    assert binding["bindingVersion"] == "0.3.0"
    assert list(channels["input"]["messages"]) == ["envelope"]
    assert list(channels["output"]["messages"]) == REPORTS
    assert list(channels) == ["input", "output", "control"]


def test_the_queue_names_come_from_the_settings_when_set() -> None:
    document = asyncapi_document(
        count_words, settings(in_queue_name="custom_in", out_queue_name="custom_out")
    )
    channels = document["channels"]
    assert channels["input"]["address"] == "custom_in"
    assert channels["input"]["bindings"]["amqp"]["queue"]["name"] == "custom_in"
    assert channels["output"]["address"] == "custom_out"
    assert channels["output"]["bindings"]["amqp"]["queue"]["name"] == "custom_out"
    assert "from custom_in" in document["info"]["description"]


def test_the_worker_receives_tasks_and_sends_reports(document: dict[str, Any]) -> None:
    receive, send = document["operations"]["receiveTask"], document["operations"]["sendReports"]
    assert receive["action"] == "receive"
    assert receive["channel"] == {"$ref": "#/channels/input"}
    assert receive["messages"] == [{"$ref": "#/channels/input/messages/envelope"}]
    assert receive["bindings"]["amqp"]["ack"] is True
    assert receive["title"] == "Run examples.count_words:handle"
    assert receive["description"].startswith("Count the words; an all-blank text fails")
    assert "within 30 s" in receive["description"]
    assert send["action"] == "send"
    assert send["channel"] == {"$ref": "#/channels/output"}
    assert send["messages"] == [{"$ref": f"#/channels/output/messages/{r}"} for r in REPORTS]
    assert send["bindings"]["amqp"] == {
        "deliveryMode": 2,
        "mandatory": True,
        "timestamp": True,
        "bindingVersion": "0.3.0",
    }


def test_the_effective_timeout_is_the_one_described() -> None:
    document = asyncapi_document(count_words, settings(worker_task_timeout_s=12.5))
    assert "within 12.5 s" in document["operations"]["receiveTask"]["description"]


def test_every_local_reference_resolves(document: dict[str, Any]) -> None:
    refs = list(refs_in(document))
    assert len(refs) > 20
    for ref in refs:
        assert ref.startswith("#/"), ref
        resolve(document, ref)  # raises KeyError when dangling


def test_the_envelope_carries_the_delivery_count_and_the_trace_context(
    document: dict[str, Any],
) -> None:
    envelope = document["components"]["messages"]["envelope"]
    headers = envelope["headers"]["properties"]
    assert list(headers) == ["x-delivery-count", "traceparent", "tracestate"]
    assert headers["x-delivery-count"]["type"] == "integer"
    assert "must not set it" in headers["x-delivery-count"]["description"]
    assert envelope["payload"] == {"$ref": "#/components/schemas/Envelope"}
    assert envelope["contentType"] == "application/json"
    assert envelope["correlationId"]["location"] == "$message.payload#/task_id"
    assert envelope["bindings"]["amqp"]["x-amqp-properties"] == {
        "content_type": "application/json",
        "delivery_mode": 2,
        "message_id": "<task_id>",
    }


@pytest.mark.parametrize("report", REPORTS)
def test_each_report_has_its_headers_and_amqp_properties(
    document: dict[str, Any], report: str
) -> None:
    message = document["components"]["messages"][report]
    assert list(message["headers"]["properties"]) == ["traceparent", "tracestate"]
    schema = f"{report.capitalize()}Report"
    assert message["payload"] == {"$ref": f"#/components/schemas/{schema}"}
    amqp = message["bindings"]["amqp"]
    assert (amqp["contentEncoding"], amqp["messageType"]) == ("utf-8", report)
    assert amqp["x-amqp-properties"] == {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "delivery_mode": 2,
        "message_id": "<task_id>/<attempt>/<seq>",
        "correlation_id": "<task_id>",
        "type": report,
        "timestamp": "<the report's timestamp, whole seconds since the Unix epoch>",
        "app_id": "count-words",
    }
    assert (
        message["summary"] == load_schema("report")["$defs"][schema]["description"].split("\n")[0]
    )


def test_the_control_exchange_is_a_channel_with_its_amqp_binding(document: dict[str, Any]) -> None:
    control = document["channels"]["control"]
    # A routingKey channel's address is the routing key, which a fanout ignores: empty, as
    # this SDK's clients publish.
    assert control["address"] == ""
    assert control["title"] == "count-words_control"
    assert control["messages"] == {"cancel": {"$ref": "#/components/messages/cancel"}}
    assert control["bindings"]["amqp"] == {
        "is": "routingKey",
        "exchange": {
            "name": "count-words_control",
            "type": "fanout",
            "durable": True,
            "autoDelete": False,
        },
        "bindingVersion": "0.3.0",
    }
    assert "from the exchange count-words_control" in document["info"]["description"]


def test_the_control_exchange_name_comes_from_the_settings_when_set() -> None:
    document = asyncapi_document(count_words, settings(control_exchange_name="ops.cancels"))
    control = document["channels"]["control"]
    assert control["title"] == "ops.cancels"
    assert control["bindings"]["amqp"]["exchange"]["name"] == "ops.cancels"
    assert "from the exchange ops.cancels" in document["info"]["description"]
    # The queues keep their own names.
    assert document["channels"]["input"]["address"] == "count-words_queue_in"


def test_the_cancel_message_has_its_payload_and_the_properties_a_client_sends(
    document: dict[str, Any],
) -> None:
    message = document["components"]["messages"]["cancel"]
    assert message["payload"] == {"$ref": "#/components/schemas/CancelRequest"}
    assert "headers" not in message
    assert "65,536 bytes" in message["description"]
    assert message["correlationId"]["location"] == "$message.payload#/task_id"
    amqp = message["bindings"]["amqp"]
    assert (amqp["contentEncoding"], amqp["messageType"]) == ("utf-8", "cancel")
    assert amqp["x-amqp-properties"] == {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "delivery_mode": 1,
        "message_id": "<task_id>/cancel",
        "correlation_id": "<task_id>",
        "type": "cancel",
        "timestamp": "<the request's timestamp, whole seconds since the Unix epoch, rounded down>",
        "app_id": "<client_id>",
    }
    # What a client publishes, filled in (vector cancels/001).
    _, sent = encode_cancel("t-0001", "client-a", datetime(2026, 11, 29, 22, 48, 46, tzinfo=UTC))
    filled = {
        name: value.replace("<task_id>", "t-0001").replace("<client_id>", "client-a")
        if isinstance(value, str)
        else value
        for name, value in amqp["x-amqp-properties"].items()
    }
    assert (filled["message_id"], filled["correlation_id"]) == (
        sent.message_id,
        sent.correlation_id,
    )
    assert (filled["type"], filled["app_id"]) == (sent.type, sent.app_id)
    assert (filled["content_type"], filled["content_encoding"], filled["delivery_mode"]) == (
        sent.content_type,
        sent.content_encoding,
        sent.delivery_mode,
    )
    schema, protocol = document["components"]["schemas"]["CancelRequest"], load_schema("cancel")
    assert "$id" not in schema and "$schema" not in schema
    expected = {k: v for k, v in protocol.items() if k not in ("$id", "$schema")}
    # Titled with its name, and protocol_version's const 1 written as the enum [1].
    expected["title"] = "CancelRequest"
    version = dict(expected["properties"]["protocol_version"])
    version["enum"] = [version.pop("const")]
    expected["properties"]["protocol_version"] = version
    assert schema == expected
    assert message["summary"] == protocol["description"].split("\n")[0]


def test_the_worker_receives_cancels(document: dict[str, Any]) -> None:
    receive = document["operations"]["receiveCancels"]
    assert receive["action"] == "receive"
    assert receive["channel"] == {"$ref": "#/channels/control"}
    assert receive["messages"] == [{"$ref": "#/channels/control/messages/cancel"}]
    assert receive["bindings"]["amqp"] == {"deliveryMode": 1, "bindingVersion": "0.3.0"}
    description = receive["description"]
    assert "a worker that does not implement cancels is still a valid v1 worker" in description
    assert "exactly one terminal report, a failure with code TASK_CANCELLED" in description
    assert "the task was cancelled at its client's request" in description
    assert list(document["operations"]) == ["receiveTask", "sendReports", "receiveCancels"]


def test_the_task_models_stand_in_the_protocol_schemas(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    envelope, protocol = schemas["Envelope"], load_schema("envelope")
    assert envelope["properties"]["input"] == {"$ref": "#/components/schemas/task.Input"}
    assert schemas["SuccessReport"]["properties"]["response"] == {
        "$ref": "#/components/schemas/task.Output"
    }
    assert schemas["task.Input"]["properties"]["text"]["maxLength"] == 100_000
    assert schemas["task.Output"]["required"] == ["words"]
    # The rest is the shipped protocol schema, its references moved to components.
    assert envelope["required"] == protocol["required"]
    assert envelope["properties"]["task_id"] == protocol["properties"]["task_id"]
    assert envelope["properties"]["input_refs"]["items"] == {
        "$ref": "#/components/schemas/InputRef"
    }
    assert schemas["InputRef"] == protocol["$defs"]["InputRef"]
    assert "$id" not in envelope and "$schema" not in envelope
    for name in ("Envelope", "StartedReport", "FailureReport"):
        assert schemas[name]["properties"]["service"]["const"] == "count-words"


@pytest.mark.parametrize("worker", [count_words, rich], ids=["count_words", "rich"])
def test_each_schema_is_titled_with_a_name_of_its_own(worker: Worker) -> None:
    # Code generators name their types after the title (Modelina does; it names the union of
    # a channel's messages after the channel): the protocol's keep their names, the task's
    # (whose pydantic titles are bare class names: Output, Envelope) take "Task" before theirs.
    document = asyncapi_document(worker, settings())
    titles = {name: schema["title"] for name, schema in document["components"]["schemas"].items()}
    for name, title in titles.items():
        assert title == (f"Task{name.removeprefix('task.')}" if name.startswith("task.") else name)
    channels = {channel.title() for channel in document["channels"]}
    assert len(set(titles.values())) == len(titles)
    assert not set(titles.values()) & channels
    assert not [
        title for name, title in titles.items() if name[:5] != "task." and title[:4] == "Task"
    ]


def _consts(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        if "const" in value:
            yield value["const"]
        for key, item in value.items():
            if key not in ("default", "examples"):
                yield from _consts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _consts(item)


def test_protocol_version_is_the_enum_1_and_every_const_left_is_a_string(
    document: dict[str, Any],
) -> None:
    # Modelina 5.10 keeps a string const as a constant; any other it leaves out of its models'
    # constructor and unmarshal, so that marshal dropped protocol_version.
    schemas = document["components"]["schemas"]
    for name in ("Envelope", *(f"{kind.title()}Report" for kind in REPORTS), "CancelRequest"):
        version = schemas[name]["properties"]["protocol_version"]
        assert (version["type"], version["enum"], "const" in version) == ("integer", [1], False)
    assert all(isinstance(value, str) for value in _consts(schemas))


def test_the_error_codes_are_the_sdks_and_the_tasks(document: dict[str, Any]) -> None:
    failure = document["components"]["messages"]["failure"]
    codes = failure["x-error-codes"]
    assert list(codes) == [*(code.value for code in ErrorCode), "EMPTY_TEXT"]
    for code in ErrorCode:
        assert codes[code] == {"reserved": code in RESERVED_ERROR_CODES, "sdk": code.description}
    assert codes["EMPTY_TEXT"] == {"reserved": False, "task": "the text holds nothing to count"}
    assert "- `EMPTY_TEXT` (task): the text holds nothing to count" in failure["description"]
    assert "- `TASK_TIMEOUT` (SDK, reserved): " in failure["description"]
    for report in ("started", "progress", "success"):
        assert "x-error-codes" not in document["components"]["messages"][report]


def test_task_schemas_are_written_in_asyncapis_draft_07_dialect() -> None:
    document = asyncapi_document(rich, settings())
    schemas = document["components"]["schemas"]
    task = schemas["task.Envelope"]
    assert schemas["Envelope"]["properties"]["input"] == {
        "$ref": "#/components/schemas/task.Envelope"
    }
    assert task["properties"]["items"]["items"] == {"$ref": "#/components/schemas/task.Item"}
    assert task["properties"]["pair"]["items"] == [{"type": "integer"}, {"type": "string"}]
    assert "prefixItems" not in task["properties"]["pair"]
    assert "discriminator" not in task["properties"]["pet"]  # each branch's const decides
    assert [schemas[ref["$ref"].rsplit("/", 1)[1]]["properties"]["kind"]["const"]
            for ref in task["properties"]["pet"]["oneOf"]] == ["cat", "dog"]  # fmt: skip
    # Values are never rewritten, only keywords.
    assert task["properties"]["extra"]["default"] == {
        "$ref": "#/$defs/kept",
        "discriminator": {"a": 1},
    }
    for ref in refs_in(schemas):
        if ref != "#/$defs/kept":  # the default value's, not a reference
            resolve(document, ref)


def test_a_task_may_describe_a_non_reserved_sdk_code_too() -> None:
    codes = asyncapi_document(rich, settings())["components"]["messages"]["failure"][
        "x-error-codes"
    ]
    assert codes["INVALID_INPUT"] == {
        "reserved": False,
        "sdk": ErrorCode.INVALID_INPUT.description,
        "task": "the items are empty",
    }
    assert codes["GONE"] == {"reserved": False, "task": "it is gone"}


def test_a_model_without_a_json_schema_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^the task's models \(Unschemable, Item\) have no"):
        asyncapi_document(unschemable, settings())


def test_a_worker_without_a_task_has_no_contract() -> None:
    with pytest.raises(NoTaskError):
        asyncapi_document(Worker("empty"), settings())


def test_each_call_gives_a_fresh_document() -> None:
    first = asyncapi_document(count_words, settings())
    first["components"]["schemas"]["Envelope"]["properties"].clear()
    second = asyncapi_document(count_words, settings())
    assert second["components"]["schemas"]["Envelope"]["properties"]


# The command


@pytest.fixture
def at_repo(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.chdir(REPO)
    for variable in ("IN_QUEUE_NAME", "OUT_QUEUE_NAME", "CONTROL_EXCHANGE_NAME", "LOG_LEVEL"):
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


def test_the_command_prints_the_document_as_indented_json(
    at_repo: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["asyncapi", "examples.count_words:worker"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.startswith('{\n  "asyncapi": "3.1.0",\n  "info": {\n')
    assert json.loads(captured.out) == asyncapi_document(count_words, settings())


def test_the_command_reads_the_queue_and_exchange_names_from_the_environment(
    at_repo: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    at_repo.setenv("IN_QUEUE_NAME", "words_in")
    at_repo.setenv("CONTROL_EXCHANGE_NAME", "words_control")
    assert main(["asyncapi", "examples.count_words:worker"]) == 0
    channels = json.loads(capsys.readouterr().out)["channels"]
    assert channels["input"]["address"] == "words_in"
    assert channels["output"]["address"] == "count-words_queue_out"
    assert channels["control"]["bindings"]["amqp"]["exchange"]["name"] == "words_control"


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_colon", "must look like my_module:worker"),
        ("examples.count_words:Input", "is not a Worker"),
        ("examples.count_words:missing", "has no attribute 'missing'"),
        ("tests.unit.cli.cli_targets:misdefined_factory", "must be annotated exactly"),
        (
            "tests.unit.cli.cli_targets_broken:worker",
            "cannot import 'tests.unit.cli.cli_targets_broken'",
        ),
        ("tests.unit.asyncapi.asyncapi_workers:unschemable", "have no JSON Schema"),
    ],
)
def test_a_bad_target_exits_2_with_one_line(
    at_repo: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    target: str,
    message: str,
) -> None:
    assert main(["asyncapi", target]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith("async-task-api-worker: ")
    assert message in captured.err


def test_a_bad_setting_exits_2_with_one_line(
    at_repo: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    at_repo.setenv("IN_QUEUE_NAME", "")
    assert main(["asyncapi", "examples.count_words:worker"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "IN_QUEUE_NAME" in err


class ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError


def test_a_closed_stdout_exits_as_sigpipe_would(at_repo: pytest.MonkeyPatch) -> None:
    at_repo.setattr(sys, "stdout", ClosedPipe())
    assert main(["asyncapi", "examples.count_words:worker"]) == CLOSED_STDOUT


def test_the_draft_07_rewrite_makes_a_const_that_is_not_a_string_an_enum() -> None:
    from async_task_api_worker.asyncapi.schemas import draft07 as _draft07

    rewritten = _draft07(
        {
            "properties": {
                "n": {"const": 1, "type": "integer"},
                "s": {"const": "a"},
                "z": {"const": None},
                "both": {"const": 2, "enum": [2, 3]},
            },
            "default": {"const": 1},
        }
    )
    assert rewritten == {
        "properties": {
            "n": {"enum": [1], "type": "integer"},
            "s": {"const": "a"},
            "z": {"enum": [None]},
            "both": {"const": 2, "enum": [2, 3]},
        },
        "default": {"const": 1},
    }


def test_the_draft_07_rewrite_keeps_a_tuples_rest_and_drops_a_discriminator() -> None:
    from async_task_api_worker.asyncapi.schemas import draft07 as _draft07

    rewritten = _draft07(
        {
            "type": "array",
            "prefixItems": [{"type": "integer"}],
            "items": {"$ref": "#/$defs/Rest"},
            "discriminator": {"propertyName": "kind"},
            "not": {"oneOf": [{"type": "string"}], "discriminator": {"mapping": {}}},
        }
    )
    assert rewritten == {
        "type": "array",
        "items": [{"type": "integer"}],
        "additionalItems": {"$ref": "#/components/schemas/Rest"},
        "not": {"oneOf": [{"type": "string"}]},
    }
