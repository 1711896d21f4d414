"""Exception descriptions carry types and frames, never messages or source lines."""

from async_task_api_worker.observability.redaction import exception_type_name, safe_traceback

SECRET = "token=abc123-secret"


class CustomError(Exception):
    pass


def fail_inner() -> None:
    raise KeyError(SECRET)


def fail_outer() -> None:
    try:
        fail_inner()
    except KeyError as exc:
        raise CustomError(SECRET) from exc


def test_the_traceback_has_frames_and_types_but_no_text() -> None:
    try:
        fail_outer()
    except CustomError as exc:
        text = safe_traceback(exc)
    assert SECRET not in text
    assert "in fail_inner" in text and "in fail_outer" in text
    assert "KeyError" in text
    assert text.rstrip().endswith("tests.unit.observability.test_redaction.CustomError")
    assert "raise" not in text  # no source line


def test_type_names() -> None:
    assert exception_type_name(ValueError()) == "ValueError"
    assert exception_type_name(CustomError()) == f"{__name__}.CustomError"


def test_a_cycle_of_causes_terminates() -> None:
    first, second = ValueError(SECRET), TypeError(SECRET)
    first.__cause__, second.__cause__ = second, first
    text = safe_traceback(first)
    assert text.count("ValueError") == 1 and SECRET not in text
