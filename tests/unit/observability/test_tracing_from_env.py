"""``submit`` and ``cancel`` set a tracer provider up as the SDK's ``OTEL_*`` variables say."""

from __future__ import annotations

import json
import textwrap

import pytest

from async_task_api_worker.cli.main import main
from tests.unit.observability.test_tracing import fresh_interpreter

SCRIPT = textwrap.dedent(
    """
    import io, json
    from async_task_api_worker.observability import tracing
    from async_task_api_worker.transports.memory import InMemoryTransport

    stream = io.StringIO()
    provider = tracing.provider_from_env(stream)
    if provider is None:
        print(json.dumps({"provider": None}))
    else:
        with tracing.sending(InMemoryTransport(), "m-1") as headers:
            headers = dict(headers)
        provider.force_flush()
        print(json.dumps({
            "provider": type(provider).__name__,
            "resource": dict(provider.resource.attributes),
            "headers": headers,
            "exported": stream.getvalue(),
        }))
    """
)


def _set_up(**environment: str) -> dict[str, object]:
    done = fresh_interpreter(SCRIPT, **environment)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_variables_set_the_resource_and_the_exporter_and_a_context_leaves() -> None:
    result = _set_up(
        OTEL_SERVICE_NAME="my-api",
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test",
        OTEL_TRACES_EXPORTER="console",
    )
    assert result["provider"] == "TracerProvider"
    resource = result["resource"]
    assert isinstance(resource, dict)
    assert resource["service.name"] == "my-api"
    assert resource["deployment.environment"] == "test"
    headers = result["headers"]
    assert isinstance(headers, dict)
    trace_id = headers["traceparent"].split("-")[1]
    exported = json.loads(str(result["exported"]))  # the console exporter, on the given stream
    assert exported["name"] == "send out"  # the memory transport names its output queue
    assert exported["context"]["trace_id"] == f"0x{trace_id}"
    assert exported["resource"]["attributes"]["service.name"] == "my-api"


def test_without_an_exporter_the_span_still_gives_its_context() -> None:
    result = _set_up(OTEL_SERVICE_NAME="my-api", OTEL_TRACES_EXPORTER="none")
    assert result["provider"] == "TracerProvider"
    assert result["exported"] == ""
    headers = result["headers"]
    assert isinstance(headers, dict) and headers["traceparent"].startswith("00-")


@pytest.mark.parametrize(
    "environment",
    [
        {},  # no OTEL_ variable: nothing asked
        {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"},
        {"OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider", "OTEL_SERVICE_NAME": "x"},
    ],
    ids=["no-variable", "disabled", "provider-named"],
)
def test_nothing_is_set_up_when_not_asked_or_disabled(environment: dict[str, str]) -> None:
    assert _set_up(**environment)["provider"] is None


def test_the_sdk_absent_sets_nothing_up() -> None:
    script = "import sys\nsys.modules['opentelemetry.sdk'] = None\n" + SCRIPT
    done = fresh_interpreter(script, OTEL_TRACES_EXPORTER="console")
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"provider": None}


@pytest.mark.parametrize("command", ["submit", "cancel"])
def test_an_exporter_not_installed_exits_2_with_one_line(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "no-such-exporter")
    arguments = ["{}"] if command == "submit" else ["t-1"]
    assert main([command, *arguments, "--service", "count-words"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "async-task-api-worker: OTEL_TRACES_EXPORTER names 'no-such-exporter', which is not "
        "installed (no opentelemetry_traces_exporter entry point of that name; the package "
        "opentelemetry-exporter-no-such-exporter would provide it)"
    ]
