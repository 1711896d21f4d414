"""The kit's options that need no broker: which cases run (``--only``, ``--with``), what
``--strict`` makes of a skip, and how the acknowledgement case sizes its hold."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from async_task_api_worker.cli.commands.conformance import case_names
from async_task_api_worker.conformance.admin import hold_length
from async_task_api_worker.conformance.battery import (
    STRICT_SKIP,
    STRICT_UNCHECKED,
    Battery,
    Outcome,
    Verdict,
    junit_xml,
    strictly,
    table,
)
from async_task_api_worker.conformance.cases import CASES, OPT_IN
from tests.unit.conformance.kit_setup import SETUP

DEFAULT = [case.name for case in CASES]


def _chosen(only: tuple[str, ...] = (), opt_in: tuple[str, ...] = ()) -> list[str]:
    battery = Battery(
        url="amqp://x/", in_queue="i", out_queue="o", setup=SETUP, only=only, opt_in=opt_in
    )
    return [case.name for case in battery.cases()]


def test_cancel_is_opt_in_and_the_default_run_leaves_it_out() -> None:
    assert [case.name for case in OPT_IN] == ["cancel"]
    assert "cancel" not in DEFAULT
    assert _chosen() == DEFAULT


def test_with_adds_an_opt_in_case_after_the_default_ones() -> None:
    assert _chosen(opt_in=("cancel",)) == [*DEFAULT, "cancel"]


def test_only_may_name_an_opt_in_case_and_runs_nothing_else() -> None:
    assert _chosen(only=("cancel",)) == ["cancel"]
    assert _chosen(only=("cancel", "order")) == ["order", "cancel"]


def test_with_adds_to_what_only_chose() -> None:
    assert _chosen(only=("order",), opt_in=("cancel",)) == ["order", "cancel"]
    assert _chosen(only=("cancel",), opt_in=("cancel",)) == ["cancel"]


def test_with_refuses_a_case_that_runs_by_default() -> None:
    with pytest.raises(ValueError, match="order is not an opt-in case"):
        _chosen(opt_in=("order",))


def test_with_refuses_an_unknown_case_with_the_list_of_cases() -> None:
    with pytest.raises(ValueError, match=r"unknown case nope \(the cases: .*cancel"):
        _chosen(opt_in=("nope",))


def test_case_lists_are_split_on_commas_and_blanks_dropped() -> None:
    assert case_names(" order, cancel,,") == ("order", "cancel")
    assert case_names("") == ()
    assert case_names(None) == ()


def test_the_command_refuses_with_of_a_default_case_with_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from async_task_api_worker.cli.main import main

    assert main(["conformance", "--service", "svc", "--strict", "--with", "order"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "order is not an opt-in case" in err[0]


SKIPPED = Verdict("acknowledgement", "the ack", Outcome.SKIP, ("needs rabbitmqctl", "x"), 0.0)


def test_strict_makes_a_skip_a_failure_that_says_it_was_skipped() -> None:
    verdict = strictly(SKIPPED)
    assert verdict.outcome is Outcome.FAIL
    assert verdict.strict_skip
    assert verdict.seen == (STRICT_SKIP + "needs rabbitmqctl", "x")


@pytest.mark.parametrize("outcome", [Outcome.PASS, Outcome.FAIL])
def test_strict_leaves_a_pass_or_a_failure_as_it_is(outcome: Outcome) -> None:
    verdict = Verdict("order", "the order", outcome, ("seen",), 1.0)
    assert strictly(verdict) is verdict


def test_strict_makes_a_pass_with_a_check_not_made_a_failure_that_says_so() -> None:
    unchecked = ("rejects: no rabbitmqctl",)
    seen = ("4 bodies", "not checked: rejects: no rabbitmqctl")
    verdict = Verdict("decoding", "poison", Outcome.PASS, seen, 1.0, unchecked=unchecked)
    failed = strictly(verdict)
    assert failed.outcome is Outcome.FAIL
    assert failed.strict_skip
    assert failed.seen == (STRICT_UNCHECKED + "rejects: no rabbitmqctl", "4 bodies")


def test_the_table_and_junit_xml_say_a_strict_failure_was_a_skip() -> None:
    verdicts = [
        Verdict("round_trip", "a round trip", Outcome.PASS, ("t: started,success",), 0.5),
        strictly(SKIPPED),
    ]
    text = table(verdicts)
    assert "| acknowledgement | FAIL | 0.0 | skipped, a failure under --strict: needs" in text
    assert text.endswith(
        "1 passed, 1 failed (1 of them skipped or not checked, failed by --strict), 0 skipped"
    )
    root = ET.fromstring(junit_xml(verdicts))  # noqa: S314 - our own output
    assert (root.get("failures"), root.get("skipped")) == ("1", "0")
    failure = next(c for c in root.iter("testcase") if c.get("name") == "acknowledgement")
    element = failure.find("failure")
    assert element is not None
    assert element.get("type") == "skipped under --strict"
    assert str(element.get("message")).startswith(STRICT_SKIP)


def test_without_strict_a_skip_stays_a_skip_in_the_counts() -> None:
    assert table([SKIPPED]).endswith("0 passed, 0 failed, 1 skipped")


@pytest.mark.parametrize(
    ("queue_type", "max_length"),
    [("classic", 1), ("quorum", 0), ("stream", None), ("unknown", None)],
)
def test_the_hold_takes_one_message_whatever_the_queue_type(
    queue_type: str, max_length: int | None
) -> None:
    """A classic queue refuses at its limit, a quorum one only once over it."""
    assert hold_length(queue_type) == max_length


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["--timeout-s", "0"], "--timeout-s must be a positive number"),
        (["--timeout-s", "-1"], "--timeout-s must be a positive number"),
        (["--timeout-s", "nan"], "--timeout-s must be a positive number"),
        (["--only", ",,"], "--only names no case"),
        (["--with", ""], "--with names no case"),
    ],
)
def test_the_command_refuses_a_bad_option_with_exit_2_and_one_line(
    arguments: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from async_task_api_worker.cli.main import main

    assert main(["conformance", "--service", "svc", *arguments]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1
    assert said in err[0]
    assert captured.out == ""


@pytest.mark.parametrize("service", ["", "_svc", "a b", "x" * 65])
def test_the_command_refuses_a_service_outside_the_protocol_pattern(
    service: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from async_task_api_worker.cli.main import main
    from async_task_api_worker.protocol.envelope import SERVICE_PATTERN

    assert main(["conformance", "--service", service]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert SERVICE_PATTERN in err[0]


def test_a_closed_port_is_one_line_and_the_client_loggers_are_left_as_they_were(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import logging

    from async_task_api_worker.cli.main import main

    before = [logging.getLogger(name).level for name in ("aiormq", "aio_pika")]
    url = "amqp://guest:guest@127.0.0.1:1/"  # port 1: nothing listens there
    assert main(["conformance", "--service", "svc", "--broker-url", url]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["async-task-api-worker: cannot connect to the broker (connection refused)"]
    assert [logging.getLogger(name).level for name in ("aiormq", "aio_pika")] == before
