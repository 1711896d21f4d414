"""Every mistake in a Worker definition raises its own error, at decoration time."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import BaseModel

from async_task_api_worker import FatalError, SyncTaskContext, TaskContext, Worker
from async_task_api_worker.definition import HandlerKind
from async_task_api_worker.errors import (
    ConfigError,
    ContextParameterError,
    DefinitionError,
    DuplicateTaskError,
    ErrorDeclarationError,
    HandlerKindError,
    HandlerSignatureError,
    HookNotAsyncError,
    InputModelError,
    InvalidProbeNameError,
    InvalidTimeoutError,
    InvalidWorkerNameError,
    NoTaskError,
    OutputModelError,
)
from async_task_api_worker.protocol.codes import RESERVED_ERROR_CODES
from async_task_api_worker.testing import WorkerHarness


class In(BaseModel):
    value: int


class Out(BaseModel):
    value: int


class MyContext(TaskContext):
    pass


def one_line(error: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_valid_async_task_is_read_from_its_annotations() -> None:
    worker = Worker("svc")

    @worker.task(timeout=2)
    async def handle(task_input: In, ctx: TaskContext) -> Out:
        return Out(value=task_input.value)

    task = worker.task_definition
    assert task.handler is handle
    assert task.kind is HandlerKind.ASYNC
    assert task.input_model is In
    assert task.output_model is Out
    assert task.timeout_s == 2.0


def test_a_valid_def_task_takes_a_sync_context() -> None:
    worker = Worker("svc")

    @worker.task(timeout=1.5)
    def handle(task_input: In, ctx: SyncTaskContext) -> Out:
        return Out(value=task_input.value)

    assert worker.task_definition.kind is HandlerKind.SYNC


def test_the_decorator_returns_the_function_unchanged() -> None:
    worker = Worker("svc")

    async def handle(task_input: In, ctx: TaskContext) -> Out:
        return Out(value=1)

    assert worker.task(timeout=1)(handle) is handle


@pytest.mark.parametrize("name", ["", "-leading-dash", "has space", "a" * 65, "é", None, 5])
def test_an_invalid_worker_name_is_refused(name: Any) -> None:
    with pytest.raises(InvalidWorkerNameError) as error:
        Worker(name)
    assert "must match" in one_line(error)


def test_a_second_task_is_refused() -> None:
    worker = Worker("svc")

    @worker.task(timeout=1)
    async def first(task_input: In, ctx: TaskContext) -> Out:
        return Out(value=1)

    with pytest.raises(DuplicateTaskError) as error:

        @worker.task(timeout=1)
        async def second(task_input: In, ctx: TaskContext) -> Out:
            return Out(value=2)

    assert "exactly one task" in one_line(error)


def test_a_worker_without_a_task_says_so() -> None:
    with pytest.raises(NoTaskError) as error:
        _ = Worker("svc").task_definition
    assert "@worker.task" in one_line(error)


def test_a_missing_timeout_is_refused() -> None:
    with pytest.raises(InvalidTimeoutError) as error:
        Worker("svc").task()
    assert "needs timeout=SECONDS" in one_line(error)


def test_the_bare_decorator_is_refused() -> None:
    async def handle(task_input: In, ctx: TaskContext) -> Out:
        return Out(value=1)

    with pytest.raises(HandlerSignatureError) as error:
        Worker("svc").task(handle)  # type: ignore[call-arg]
    assert "@worker.task(timeout=SECONDS)" in one_line(error)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), True, "30"])
def test_an_invalid_timeout_is_refused(timeout: Any) -> None:
    with pytest.raises(InvalidTimeoutError) as error:
        Worker("svc").task(timeout=timeout)
    assert "positive, finite" in one_line(error)


def test_an_async_handler_with_a_sync_context_is_refused() -> None:
    with pytest.raises(ContextParameterError) as error:

        @Worker("svc").task(timeout=1)
        async def handle(task_input: In, ctx: SyncTaskContext) -> Out:
            return Out(value=1)

    assert one_line(error).endswith("exactly TaskContext (an async def handler)")


def test_a_def_handler_with_an_async_context_is_refused() -> None:
    with pytest.raises(ContextParameterError) as error:

        @Worker("svc").task(timeout=1)
        def handle(task_input: In, ctx: TaskContext) -> Out:
            return Out(value=1)

    assert one_line(error).endswith("exactly SyncTaskContext (a plain def handler)")


def test_swapped_parameters_are_named_the_wrong_way_round() -> None:
    with pytest.raises(ContextParameterError) as error:

        @Worker("svc").task(timeout=1)
        async def handle(ctx: TaskContext, task_input: In) -> Out:  # type: ignore[type-var]
            return Out(value=1)

    assert one_line(error).endswith(
        "the parameters are the wrong way round: the signature is "
        "(task_input: <a pydantic model>, ctx: TaskContext)"
    )


def test_a_context_subclass_is_refused() -> None:
    with pytest.raises(ContextParameterError):

        @Worker("svc").task(timeout=1)
        async def handle(task_input: In, ctx: MyContext) -> Out:
            return Out(value=1)


def test_an_annotated_context_is_refused() -> None:
    with pytest.raises(ContextParameterError):

        @Worker("svc").task(timeout=1)
        async def handle(task_input: In, ctx: Annotated[TaskContext, "x"]) -> Out:
            return Out(value=1)


def test_a_missing_context_annotation_is_refused() -> None:
    with pytest.raises(ContextParameterError):

        @Worker("svc").task(timeout=1)
        async def handle(task_input: In, ctx) -> Out:  # type: ignore[no-untyped-def]
            return Out(value=1)


def test_an_input_that_is_not_a_model_is_refused() -> None:
    with pytest.raises(InputModelError) as error:

        @Worker("svc").task(timeout=1)
        async def handle(task_input: dict[str, Any], ctx: TaskContext) -> Out:
            return Out(value=1)

    assert "BaseModel" in one_line(error)


def test_an_output_that_is_not_a_model_is_refused() -> None:
    with pytest.raises(OutputModelError):

        @Worker("svc").task(timeout=1)
        async def handle(task_input: In, ctx: TaskContext) -> dict[str, int]:
            return {"value": 1}


def test_a_missing_return_annotation_is_refused() -> None:
    with pytest.raises(OutputModelError):

        @Worker("svc").task(timeout=1)
        async def handle(task_input: In, ctx: TaskContext):  # type: ignore[no-untyped-def]
            return Out(value=1)


@pytest.mark.parametrize(
    "source",
    [
        "async def handle(task_input: In) -> Out: ...",
        "async def handle(task_input: In, ctx: TaskContext, extra: int) -> Out: ...",
        "async def handle(*args: In) -> Out: ...",
        "async def handle(task_input: In, *, ctx: TaskContext) -> Out: ...",
        "async def handle(task_input: In, **ctx: TaskContext) -> Out: ...",
    ],
)
def test_a_handler_with_the_wrong_parameters_is_refused(source: str) -> None:
    namespace: dict[str, Any] = {"In": In, "Out": Out, "TaskContext": TaskContext}
    exec(source, namespace)  # noqa: S102 - building signatures that cannot be written inline
    with pytest.raises(HandlerSignatureError) as error:
        Worker("svc").task(timeout=1)(namespace["handle"])
    assert "exactly two positional parameters" in one_line(error)


def test_unresolvable_annotations_are_refused() -> None:
    namespace: dict[str, Any] = {}
    exec(  # noqa: S102
        "async def handle(task_input: 'Missing', ctx: 'TaskContext') -> 'Out': ...", namespace
    )
    with pytest.raises(HandlerSignatureError) as error:
        Worker("svc").task(timeout=1)(namespace["handle"])
    assert "cannot be resolved (NameError)" in one_line(error)


def test_string_annotations_are_resolved() -> None:
    namespace: dict[str, Any] = {"In": In, "Out": Out, "TaskContext": TaskContext}
    exec("async def handle(task_input: 'In', ctx: 'TaskContext') -> 'Out': ...", namespace)  # noqa: S102
    worker = Worker("svc")
    worker.task(timeout=1)(namespace["handle"])
    assert worker.task_definition.input_model is In


def test_a_generator_handler_is_refused() -> None:
    with pytest.raises(HandlerKindError):

        @Worker("svc").task(timeout=1)
        async def handle(task_input: In, ctx: TaskContext) -> Out:  # type: ignore[misc]
            yield Out(value=1)


def test_a_callable_object_is_refused() -> None:
    class Handler:
        async def __call__(self, task_input: In, ctx: TaskContext) -> Out:
            return Out(value=1)

    with pytest.raises(HandlerKindError):
        Worker("svc").task(timeout=1)(Handler())


@pytest.mark.parametrize("hook", ["on_startup", "on_shutdown", "readiness_probe"])
def test_hooks_must_be_async(hook: str) -> None:
    def not_async() -> None: ...

    with pytest.raises(HookNotAsyncError) as error:
        getattr(Worker("svc"), hook)(not_async)
    assert "async def" in one_line(error)


def test_hooks_and_probes_are_registered_in_order() -> None:
    worker = Worker("svc")

    @worker.on_startup
    async def first() -> None: ...

    @worker.on_startup
    async def second() -> None: ...

    @worker.on_shutdown
    async def closing() -> None: ...

    @worker.readiness_probe
    async def database() -> bool:
        return True

    @worker.readiness_probe(name="cache-1")
    async def check_cache() -> bool:
        return True

    assert worker.startup_hooks == (first, second)
    assert worker.shutdown_hooks == (closing,)
    assert worker.readiness_probes == {"database": database, "cache-1": check_cache}


@pytest.mark.parametrize("name", ["broker", "draining", "Bad Name", ""])
def test_a_reserved_or_invalid_probe_name_is_refused(name: str) -> None:
    async def probe() -> bool:
        return True

    with pytest.raises(InvalidProbeNameError):
        Worker("svc").readiness_probe(name=name)(probe)


def test_a_probe_name_is_used_once() -> None:
    worker = Worker("svc")

    async def probe() -> bool:
        return True

    worker.readiness_probe(name="db")(probe)
    with pytest.raises(InvalidProbeNameError) as error:
        worker.readiness_probe(name="db")(probe)
    assert "already used" in one_line(error)


def test_definition_errors_are_config_and_type_errors() -> None:
    assert issubclass(DefinitionError, ConfigError)
    assert issubclass(DefinitionError, TypeError)
    assert issubclass(DefinitionError, ValueError)


def test_a_task_declares_no_error_codes_by_default() -> None:
    worker = Worker("svc")

    @worker.task(timeout=1)
    async def handle(task_input: In, ctx: TaskContext) -> Out:
        return Out(value=1)

    assert dict(worker.task_definition.errors) == {}
    assert hash(worker.task_definition)  # still hashable


def test_declared_error_codes_are_kept_as_a_read_only_copy() -> None:
    declared = {"EMPTY_TEXT": "the text is blank", "INVALID_INPUT": "the text is not UTF-8"}
    worker = Worker("svc")

    @worker.task(timeout=1, errors=declared)
    async def handle(task_input: In, ctx: TaskContext) -> Out:
        return Out(value=1)

    declared["LATER"] = "added after the decorator ran"
    errors = worker.task_definition.errors
    assert dict(errors) == {
        "EMPTY_TEXT": "the text is blank",
        "INVALID_INPUT": "the text is not UTF-8",
    }
    with pytest.raises(TypeError):
        errors["X"] = "y"  # type: ignore[index]


@pytest.mark.parametrize("code", ["", "lower", "1START", "WITH-DASH", "A" * 65, 3, None])
def test_a_declared_code_outside_the_code_rule_is_refused(code: Any) -> None:
    with pytest.raises(ErrorDeclarationError) as error:
        Worker("svc").task(timeout=1, errors={code: "why"})
    assert "does not match ^[A-Z][A-Z0-9_]{0,63}$" in one_line(error)


@pytest.mark.parametrize("code", sorted(RESERVED_ERROR_CODES))
def test_a_declared_code_reserved_for_the_sdk_is_refused(code: str) -> None:
    with pytest.raises(ErrorDeclarationError) as error:
        Worker("svc").task(timeout=1, errors={code: "why"})
    assert f"errors: {code} is reserved for the SDK" in one_line(error)


@pytest.mark.parametrize("description", ["", "   ", None, 3])
def test_a_declared_code_needs_a_description(description: Any) -> None:
    with pytest.raises(ErrorDeclarationError) as error:
        Worker("svc").task(timeout=1, errors={"EMPTY_TEXT": description})
    assert "errors: EMPTY_TEXT needs a description" in one_line(error)


def test_declared_errors_must_be_a_mapping() -> None:
    with pytest.raises(ErrorDeclarationError) as error:
        Worker("svc").task(timeout=1, errors=[("EMPTY_TEXT", "why")])  # type: ignore[arg-type]
    assert "errors must map error codes to descriptions, got list" in one_line(error)
    assert issubclass(ErrorDeclarationError, DefinitionError)


async def test_a_code_the_task_did_not_declare_can_still_be_raised() -> None:
    worker = Worker("svc")

    @worker.task(timeout=1, errors={"DECLARED": "a declared failure"})
    async def handle(task_input: In, ctx: TaskContext) -> Out:
        raise FatalError("NOT_DECLARED", "documentation only")

    async with WorkerHarness(worker) as harness:
        run = await harness.submit({"value": 1})
    run.assert_failed(code="NOT_DECLARED")
