"""The conformance kit's parts that need no broker: the encoding check, the verdicts' table and
JUnit XML, the case selection, the operator tool's parsing, the envelopes at the limits."""

from __future__ import annotations

import asyncio
import gc
import json
import stat
import warnings
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.conformance import admin as admin_module
from async_task_api_worker.conformance.admin import HOLD_POLICY, Admin, AdminError, release_at_end
from async_task_api_worker.conformance.battery import (
    Battery,
    Outcome,
    Verdict,
    junit_xml,
    table,
)
from async_task_api_worker.conformance.case import Findings, envelope
from async_task_api_worker.conformance.inbound_cases import nested, padded
from async_task_api_worker.conformance.report_cases import check_encoding, schema_validator
from async_task_api_worker.conformance.wire import Seen
from async_task_api_worker.protocol.encoding import nesting_depth, strict_loads
from async_task_api_worker.protocol.reports import SuccessReport, encode_report
from tests.polling import until
from tests.unit.conformance.kit_setup import SETUP


def _seen(body: bytes, **properties: Any) -> Seen:
    document = json.loads(body)
    return Seen(body=body, document=document, properties=properties, at=0.0)


def _success() -> tuple[bytes, dict[str, Any]]:
    report = SuccessReport(
        protocol_version=1,
        type="success",
        task_id="t-1",
        client_id="c",
        service="conformance",
        attempt=2,
        timestamp="2026-11-29T22:48:46.123456Z",
        response={"b": 1.0, "a": [1, "é"]},
    )
    encoded = encode_report(report, seq=1)
    return encoded.body, dict(encoded.properties.recorded())


def test_a_report_as_this_sdk_encodes_it_passes_the_encoding_check() -> None:
    body, properties = _success()
    found = Findings()
    position = check_encoding(found, _seen(body, **properties), "conformance", schema_validator())
    assert found.problems == []
    assert position == (2, 1)


def test_unsorted_keys_fail_the_encoding_check() -> None:
    body, properties = _success()
    document = json.loads(body)
    unsorted = json.dumps(
        dict(reversed(list(document.items()))), separators=(",", ":"), ensure_ascii=False
    ).encode()
    found = Findings()
    check_encoding(found, _seen(unsorted, **properties), "conformance", None)
    assert any("not the canonical encoding" in problem for problem in found.problems)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("delivery_mode", 1),
        ("content_type", "text/plain"),
        ("app_id", "another"),
        ("message_id", "t-1/1/1"),
        ("timestamp", 0),
    ],
)
def test_each_property_the_protocol_names_is_checked(name: str, value: object) -> None:
    body, properties = _success()
    properties[name] = value
    found = Findings()
    check_encoding(found, _seen(body, **properties), "conformance", None)
    assert found.problems, name


def test_a_body_that_is_not_json_is_a_problem_not_a_crash() -> None:
    found = Findings()
    seen = Seen(body=b"\xff", document=None, properties={"message_id": "x"}, at=0.0)
    assert check_encoding(found, seen, "conformance", None) is None
    assert found.problems == ["x: the body is not a JSON object"]


def test_the_schema_check_names_a_missing_field() -> None:
    validate = schema_validator()
    assert validate is not None
    body, _ = _success()
    document = json.loads(body)
    del document["task_id"]
    assert validate(document) == ["$ (required): 'task_id' is a required property"]


def test_the_schema_check_leaves_the_fields_of_the_every_report_rules_to_them() -> None:
    validate = schema_validator()
    assert validate is not None
    body, _ = _success()
    document = json.loads(body)
    del document["attempt"]
    document["timestamp"] = "2026-11-29T22:48:46.123Z"
    document["protocol_version"] = 2
    assert validate(document) == []
    assert validate({**document, "extra": 1}) == [
        "$ (additionalProperties): Additional properties are not allowed ('extra' was unexpected)"
    ]


def test_the_schema_check_names_the_path_and_keyword_of_at_most_two_errors() -> None:
    validate = schema_validator()
    assert validate is not None
    body, _ = _success()
    document = {**json.loads(body), "type": "failure", "response": None}
    del document["response"]
    document["error"] = {"code": "not a code", "message": 5, "extra": True}
    lines = validate(document)
    assert len(lines) == 2
    assert all(line.startswith("$.error") for line in lines), lines
    assert "$.error.code (pattern): 'not a code' does not match" in " ".join(lines)


def test_a_report_of_no_known_type_is_said_by_its_type() -> None:
    validate = schema_validator()
    assert validate is not None
    body, _ = _success()
    lines = validate({**json.loads(body), "type": "done"})
    assert len(lines) == 1
    assert lines[0].startswith("$.type (const): "), lines


def test_the_canonical_encoding_line_shows_where_the_bytes_part() -> None:
    body, properties = _success()
    spaced = body.replace(b'"client_id":"c",', b'"client_id": "c",')
    found = Findings()
    check_encoding(found, _seen(spaced, **properties), "conformance", None)
    [line] = found.problems
    offset = body.index(b'"c"')  # where the space goes in
    assert (
        f"not the canonical encoding (key order, separators, number or string forms): at byte "
        f"{offset} (of {len(body)} expected, {len(spaced)} sent): " in line
    )
    assert """expected b'{"attempt":2,"client_id":"c",""" in line
    assert """sent b'{"attempt":2,"client_id": "c",""" in line
    assert "\n" not in line


def test_a_timestamp_of_another_form_is_left_to_the_every_report_rules() -> None:
    report = SuccessReport(
        protocol_version=1,
        type="success",
        task_id="t-1",
        client_id="c",
        service="conformance",
        attempt=2,
        timestamp="2026-11-29T22:48:46.123456Z",
        response={},
    )
    encoded = encode_report(report, seq=1)
    properties = dict(encoded.properties.recorded())
    millis = encoded.body.replace(b"46.123456Z", b"46.123Z")
    found = Findings()
    check_encoding(found, _seen(millis, **properties), "conformance", schema_validator())
    assert found.problems == []
    properties["timestamp"] = properties["timestamp"] * 1000
    check_encoding(found, _seen(millis, **properties), "conformance", schema_validator())
    assert len(found.problems) == 1
    assert "AMQP timestamp" in found.problems[0]


def test_padded_envelopes_are_exactly_the_size_asked_for() -> None:
    for size in (1024, 4096, 4097):
        body = padded(SETUP, "t-1", size)
        assert len(body) == size
        assert strict_loads(body.decode())["input"]["behaviour"] == "succeed"


def test_nested_inputs_reach_the_depth_the_limits_case_means() -> None:
    body = envelope(SETUP, "t-1", {"behaviour": "succeed", "deep": nested(62)})
    assert nesting_depth(strict_loads(body.decode())) == 64


def test_unknown_cases_are_refused_with_the_list_of_cases() -> None:
    battery = Battery(url="amqp://x/", in_queue="i", out_queue="o", setup=SETUP, only=("nope",))
    with pytest.raises(ValueError, match="unknown case nope"):
        battery.cases()
    chosen = Battery(url="amqp://x/", in_queue="i", out_queue="o", setup=SETUP, only=("order",))
    assert [case.name for case in chosen.cases()] == ["order"]


VERDICTS = [
    Verdict("round_trip", "a round trip", Outcome.PASS, ("t: started,success",), 0.5),
    Verdict("order", "the order", Outcome.FAIL, ("t: ['progress'] after the terminal | x",), 1.0),
    Verdict("acknowledgement", "the ack", Outcome.SKIP, ("needs rabbitmqctl",), 0.0),
]


def test_the_table_has_a_row_per_case_and_the_counts() -> None:
    text = table(VERDICTS)
    assert "| order | FAIL | 1.0 | t: ['progress'] after the terminal \\| x |" in text
    assert text.endswith("1 passed, 1 failed, 1 skipped")


def test_junit_xml_has_a_testcase_per_case_with_failures_and_skips() -> None:
    root = ET.fromstring(junit_xml(VERDICTS))  # noqa: S314 - our own output
    assert root.tag == "testsuite"
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("3", "1", "1")
    cases = {case.get("name"): case for case in root.iter("testcase")}
    assert cases["order"].find("failure") is not None
    assert cases["acknowledgement"].find("skipped") is not None
    assert cases["round_trip"].find("failure") is None


def _fake_rabbitmqctl(tmp_path: Path, output: str, code: int = 0) -> str:
    script = tmp_path / "rabbitmqctl"
    script.write_text(
        f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\nprintf '%s' '{output}'\nexit {code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


async def test_unacked_sums_the_vhosts_channels_only(tmp_path: Path) -> None:
    listing = "v1\t2\nv2\t5\nv1\t1\n"
    admin = Admin(_fake_rabbitmqctl(tmp_path, listing), "v1")
    assert await admin.unacked() == 3


async def test_the_hold_policy_is_scoped_to_the_vhost_and_the_one_queue(tmp_path: Path) -> None:
    admin = Admin(_fake_rabbitmqctl(tmp_path, ""), "v1")
    await admin.hold("svc_queue.out", 1)
    call = (tmp_path / "calls").read_text()
    assert '"max-length": 1' in call
    assert "set_policy -p v1" in call
    assert r"^svc_queue\.out$" in call
    assert '"overflow": "reject-publish"' in call


async def test_the_dead_letter_policy_is_the_kits_one_policy_on_the_one_queue(
    tmp_path: Path,
) -> None:
    admin = Admin(_fake_rabbitmqctl(tmp_path, ""), "v1")
    await admin.dead_letter("svc_queue.in", "atw-conformance-dead-r1")
    await admin.release()
    set_call, clear_call = (tmp_path / "calls").read_text().splitlines()
    assert set_call.startswith(f"set_policy -p v1 --apply-to queues --priority 999 {HOLD_POLICY} ")
    assert r"^svc_queue\.in$" in set_call
    assert set_call.endswith('{"dead-letter-exchange": "atw-conformance-dead-r1"}')
    assert clear_call == f"clear_policy -p v1 {HOLD_POLICY}"


async def test_a_failing_rabbitmqctl_is_an_admin_error_naming_its_last_line(
    tmp_path: Path,
) -> None:
    admin = Admin(_fake_rabbitmqctl(tmp_path, "first\\nError: no such vhost", code=2), "v1")
    with pytest.raises(AdminError, match="no such vhost"):
        await admin.unacked()


async def test_a_rabbitmqctl_that_cannot_run_is_an_admin_error(tmp_path: Path) -> None:
    admin = Admin(str(tmp_path / "missing" / "rabbitmqctl"), "v1")
    with pytest.raises(AdminError, match="cannot run"):
        await admin.unacked()


async def test_a_cancelled_call_leaves_no_process_and_no_open_pipe(tmp_path: Path) -> None:
    # A script whose child holds the pipes, as rabbitmqctl's Erlang VM does (a chroot's too).
    script = tmp_path / "rabbitmqctl"
    script.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {tmp_path / 'child'}\nwait\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    call = asyncio.ensure_future(Admin(str(script), "v1").unacked())
    await until(lambda: (tmp_path / "child").exists() and (tmp_path / "child").read_text(), 10)
    child = int((tmp_path / "child").read_text())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        del call
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert _gone(child)


def _gone(pid: int) -> bool:
    """Whether ``pid`` is dead: no such process, or a zombie waiting for its reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def test_releasing_a_hold_that_is_not_there_is_fine(tmp_path: Path) -> None:
    admin = Admin(_fake_rabbitmqctl(tmp_path, "Error: Parameter does not exist: not found", 2), "v")
    await admin.release()


def test_the_timestamp_property_check_uses_whole_seconds() -> None:
    _, properties = _success()
    moment = datetime(2026, 11, 29, 22, 48, 46, tzinfo=UTC)
    assert properties["timestamp"] == int(moment.timestamp())


def test_the_command_refuses_an_unknown_case_with_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from async_task_api_worker.cli.main import main

    assert main(["conformance", "--service", "svc", "--only", "speed"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "unknown case speed" in err[0]


def test_the_command_says_in_one_line_that_the_broker_is_unreachable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from async_task_api_worker.cli.main import main

    code = main(
        ["conformance", "--service", "svc", "--broker-url", "amqp://guest:guest@127.0.0.1:1/"]
    )
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "cannot connect to the broker" in err[0]


def _down_once_rabbitmqctl(tmp_path: Path) -> str:
    """A fake rabbitmqctl that fails its first call (a node restarting), then succeeds."""
    script = tmp_path / "rabbitmqctl-down-once"
    up = tmp_path / "up"
    script.write_text(
        f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n'
        f"if [ -e {up} ]; then exit 0; fi\ntouch {up}\necho 'Error: nodedown' >&2\nexit 69\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


async def test_the_release_at_a_cases_end_tries_again_while_the_broker_is_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(admin_module, "_RELEASE_PAUSE_S", 0.0)
    await release_at_end(Admin(_down_once_rabbitmqctl(tmp_path), "v1"), was_set=True)
    assert (tmp_path / "calls").read_text().splitlines() == [
        f"clear_policy -p v1 {HOLD_POLICY}"
    ] * 2
    assert capsys.readouterr().err == ""


async def test_a_release_that_keeps_failing_says_in_one_line_what_may_be_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(admin_module, "_RELEASE_PAUSE_S", 0.0)
    failing = _fake_rabbitmqctl(tmp_path, "Error: nodedown", code=69)
    await release_at_end(Admin(failing, "v 1"), was_set=True)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == admin_module._RELEASE_TRIES
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert f"the policy {HOLD_POLICY} may be left in vhost 'v 1'" in err[0]
    assert "the next run removes it" in err[0]
    assert f"rabbitmqctl clear_policy -p 'v 1' {HOLD_POLICY}" in err[0]


async def test_a_release_with_no_policy_asked_for_tries_once_and_says_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await release_at_end(
        Admin(_fake_rabbitmqctl(tmp_path, "Error: nodedown", code=69), "v1"), was_set=False
    )
    assert len((tmp_path / "calls").read_text().splitlines()) == 1
    assert capsys.readouterr().err == ""
