"""The public surface is declared, grouped and pinned: a rename must be deliberate."""

import async_task_api_worker
import async_task_api_worker.testing
from async_task_api_worker import protocol


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
            "TaskContext",
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
