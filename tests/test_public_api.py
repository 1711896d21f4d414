"""The public surface is declared, grouped and pinned: a rename must be deliberate."""

import builtins
import inspect
from collections.abc import Iterator

import async_task_api_worker
import async_task_api_worker.client
import async_task_api_worker.detached
import async_task_api_worker.errors
import async_task_api_worker.sfn
import async_task_api_worker.testing
from async_task_api_worker import protocol
from async_task_api_worker.runtime.exit_codes import ExitCode


def test_the_package_exports_exactly_its_public_names() -> None:
    assert sorted(async_task_api_worker.__all__) == sorted(
        [
            "AsyncTaskWorkerError",
            "ConfigError",
            "DefinitionError",
            "FatalError",
            "RetryableError",
            "SettingsError",
            "SyncTaskContext",
            "TaskCancelledError",
            "TaskContext",
            "TaskErrorInput",
            "Worker",
            "WorkerSettings",
            "__version__",
        ]
    )


def test_the_testing_api_of_the_seed_exists() -> None:
    assert sorted(async_task_api_worker.testing.__all__) == sorted(
        [
            "Outcome",
            "ProgressRecorder",
            "TaskRun",
            "WorkerHarness",
            "make_sync_task_context",
            "make_task_context",
        ]
    )
    outcome = async_task_api_worker.testing.Outcome
    assert {outcome.ACKED, outcome.NACKED_REQUEUE} <= set(outcome)


def test_every_exported_name_resolves() -> None:
    for module in (async_task_api_worker, async_task_api_worker.testing, protocol):
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"


def test_the_version_is_a_string() -> None:
    assert async_task_api_worker.__version__ == "0.1.0"


def test_the_detached_api_of_the_seed_is_pinned() -> None:
    assert sorted(async_task_api_worker.detached.__all__) == [
        "Marker",
        "SweepReport",
        "Undeliverable",
        "in_flight",
        "spawn_detached",
        "sweep",
    ]


def test_the_protocol_api_is_pinned() -> None:
    assert sorted(protocol.__all__) == sorted(
        [
            "CancelDecodeReason",
            "CancelRequest",
            "DEFAULT_MAX_BODY_BYTES",
            "ERROR_CODE_PATTERN",
            "EncodedReport",
            "Envelope",
            "ErrorCode",
            "FailureReport",
            "ID_PATTERN",
            "InputRef",
            "MAX_CANCEL_BYTES",
            "MAX_ERROR_MESSAGE_CHARS",
            "MAX_NESTING_DEPTH",
            "MAX_REPORT_BYTES",
            "MessageProperties",
            "PROTOCOL_VERSION",
            "PoisonReason",
            "ProgressReport",
            "RESERVED_ERROR_CODES",
            "Report",
            "ReportError",
            "ReportType",
            "SERVICE_PATTERN",
            "StartedReport",
            "SuccessReport",
            "canonical_dumps",
            "decode_cancel",
            "decode_envelope",
            "decode_report",
            "encode_cancel",
            "encode_report",
            "format_timestamp",
        ]
    )


def test_the_client_api_is_pinned() -> None:
    assert sorted(async_task_api_worker.client.__all__) == [
        "AnyReport",
        "TaskClient",
        "build_envelope",
    ]


def test_the_step_functions_api_of_the_seed_is_pinned() -> None:
    # Seed 000's names, unchanged now that the worker runs on the engine.
    assert sorted(async_task_api_worker.sfn.__all__) == sorted(
        [
            "AbortedStaleTask",
            "ErrorOutput",
            "MalformedMessage",
            "MalformedSubprocessOutput",
            "NonEmptyStr",
            "SubprocessCrashError",
            "SubprocessOutputTooLarge",
            "SubprocessTimeoutError",
            "UnknownSubprocessError",
            "Worker",
            "WorkerRequest",
            "run_handler",
        ]
    )


def test_the_exit_codes_are_pinned() -> None:
    assert {code.name: code.value for code in ExitCode} == {"OK": 0, "FAILURE": 1, "CONFIG": 2}


PUBLIC_MODULES = (
    async_task_api_worker,
    async_task_api_worker.client,
    async_task_api_worker.detached,
    async_task_api_worker.errors,
    async_task_api_worker.sfn,
    async_task_api_worker.testing,
    protocol,
)


def _public_callables() -> Iterator[tuple[str, object]]:
    for module in PUBLIC_MODULES:
        for name in module.__all__:
            value = getattr(module, name)
            yield f"{module.__name__}.{name}", value
            if inspect.isclass(value):
                for member_name, member in vars(value).items():
                    if not member_name.startswith("_") or member_name == "__init__":
                        yield f"{module.__name__}.{name}.{member_name}", member


def _raised_names(doc: str) -> Iterator[str]:
    """The exception names of a Google-style ``Raises:`` section."""
    lines = doc.splitlines()
    for number, line in enumerate(lines):
        if line.strip() != "Raises:":
            continue
        indent = len(line) - len(line.lstrip())
        for entry in lines[number + 1 :]:
            if entry.strip() and len(entry) - len(entry.lstrip()) <= indent:
                break
            head = entry.strip().split(":", 1)[0]
            if ":" in entry and len(entry) - len(entry.lstrip()) == indent + 4:
                yield from (part.strip() for part in head.split(","))


def test_every_exception_a_public_call_documents_can_be_imported() -> None:
    exported = {
        name
        for module in PUBLIC_MODULES
        for name in module.__all__
        if inspect.isclass(getattr(module, name))
        and issubclass(getattr(module, name), BaseException)
    }
    documented: dict[str, str] = {}
    for where, value in _public_callables():
        for name in _raised_names(inspect.getdoc(value) or ""):
            documented.setdefault(name, where)
    assert documented  # the scan found the Raises: sections
    missing = {
        name: where
        for name, where in documented.items()
        if name not in exported and not hasattr(builtins, name) and name != "ValidationError"
    }
    assert missing == {}
