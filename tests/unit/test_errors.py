"""The error tree: codes, retry semantics, the code rule, misuse kept apart."""

from __future__ import annotations

import pytest

from async_task_api_worker import errors
from async_task_api_worker.errors import (
    AsyncTaskWorkerError,
    ConfigError,
    FatalError,
    InvalidErrorCodeError,
    RetryableError,
    TaskError,
)
from async_task_api_worker.protocol import ErrorCode
from async_task_api_worker.protocol.codes import ERROR_CODE_PATTERN, RESERVED_ERROR_CODES


def test_fatal_error_carries_its_code_and_message() -> None:
    error = FatalError("EMPTY_TEXT", "There is nothing to count.")
    assert (error.task_code, error.message) == ("EMPTY_TEXT", "There is nothing to count.")
    assert str(error) == "EMPTY_TEXT: There is nothing to count."
    assert not error.retryable


def test_retryable_error_defaults_and_delay() -> None:
    error = RetryableError()
    assert error.task_code == "TRANSIENT_ERROR"
    assert error.retryable and error.retry_delay_s is None
    assert RetryableError("DOWN", "down", retry_delay_s=2).retry_delay_s == 2.0


@pytest.mark.parametrize("delay", [-1, float("inf"), float("nan")])
def test_retryable_error_refuses_a_bad_delay(delay: float) -> None:
    with pytest.raises(ValueError, match="retry_delay_s"):
        RetryableError(retry_delay_s=delay)


@pytest.mark.parametrize("code", ["", "lower", "1START", "A" * 65, "WITH-DASH", None])
def test_a_code_outside_the_rule_is_refused(code: str) -> None:
    with pytest.raises(InvalidErrorCodeError, match="does not match"):
        FatalError(code, "x")


@pytest.mark.parametrize("code", sorted(RESERVED_ERROR_CODES))
def test_a_reserved_code_is_refused(code: str) -> None:
    with pytest.raises(InvalidErrorCodeError, match="reserved for the SDK"):
        FatalError(code, "x")


def test_a_handler_may_raise_invalid_input_itself() -> None:
    assert FatalError("INVALID_INPUT", "the date range is empty").task_code == "INVALID_INPUT"


def test_reserved_codes_are_the_sdk_codes_a_handler_cannot_claim() -> None:
    assert set(ErrorCode) - RESERVED_ERROR_CODES == {"INVALID_INPUT", "TRANSIENT_ERROR"}
    assert all(ERROR_CODE_PATTERN.fullmatch(code) for code in ErrorCode)


def test_every_sdk_code_says_what_it_means() -> None:
    for code in ErrorCode:
        assert code.description.strip().endswith("."), code
    assert ErrorCode.TASK_TIMEOUT.description.startswith("The handler ran past its timeout")


def test_a_long_message_is_cut() -> None:
    assert len(FatalError("X", "y" * 5000).message) == 1024


def test_every_exported_error_is_rooted_and_named_error() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, AsyncTaskWorkerError), name
        assert name.endswith("Error"), name
        assert isinstance(cls.code, str) and isinstance(cls.retryable, bool)


def test_misuse_is_kept_apart_from_task_failures() -> None:
    assert issubclass(ConfigError, ValueError)
    assert not issubclass(TaskError, ConfigError)
    assert not issubclass(ConfigError, TaskError)
