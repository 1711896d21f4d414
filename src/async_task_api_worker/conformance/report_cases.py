"""The cases about the reports themselves: their bytes and properties, and their order.

See ``conformance.case`` for what a case is; docs/protocol.md for the rules.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

from async_task_api_worker.conformance.case import (
    SETTLE_S,
    Findings,
    Setup,
    envelope,
    kinds,
    task_id,
    terminal,
)
from async_task_api_worker.conformance.differences import (
    MISSING,
    byte_difference,
    schema_lines,
    value_difference,
)
from async_task_api_worker.conformance.report_rules import RULED_FIELDS
from async_task_api_worker.conformance.wire import Seen, Wire
from async_task_api_worker.protocol.codes import MAX_ERROR_MESSAGE_CHARS
from async_task_api_worker.protocol.encoding import canonical_dumps, strict_loads

__all__ = ["LONG_MESSAGE", "check_encoding", "cut_problem", "encoding", "order", "schema_validator"]

# ------------------------------------------------------------------------------- encoding

#: A handler's message of 1,500 characters (code points), some of two UTF-8 bytes, some of
#: four (and two UTF-16 units): a worker must report its first 1,024 characters.
LONG_MESSAGE: Final = "abcdé😀" * 250


def cut_problem(sent: str, reported: object) -> str | None:
    """Why ``reported`` (a failure's ``error.message``) is not what the worker must report.

    docs/protocol.md, "Error codes": a message is at most 1,024 characters (code points), and
    the worker cuts a longer one: the kit requires the handler's message cut to its first
    :data:`~async_task_api_worker.protocol.MAX_ERROR_MESSAGE_CHARS` characters, as this SDK
    cuts it (a shorter message whole).

    Returns:
        The problem in a phrase; ``None`` when ``reported`` is that.
    """
    limit = MAX_ERROR_MESSAGE_CHARS
    if reported == sent[:limit]:
        return None
    if not isinstance(reported, str):
        return f"error.message is {type(reported).__name__}, not a string"
    if len(reported) > limit:
        return (
            f"error.message of {len(reported):,} characters, over the limit of {limit:,}: "
            f"a longer message is cut to its first {limit:,}"
        )
    return f"error.message ({len(reported):,} characters) is not the handler's message" + (
        f" cut to its first {limit:,} characters" if len(sent) > limit else ""
    )


_TRICKY_OUTPUT: Final[dict[str, Any]] = {
    "z": 1,
    "a": 1.0,
    "e": 1.2345e-07,
    "big": 12345678901234567890,
    "f": 2500.0,
    "s": 'quote " backslash \\ nl \n tab \t ctl \u0001 vt \u000b del \u007f ls \u2028 / é 😀',
    "\uff5a": "fullwidth z sorts before the emoji",
    "\U0001f600": "emoji",
    "n": None,
    "t": True,
    "l": [1.5, {"y": 2, "x": []}, "b"],
    "o": {"b": {}, "a": [0.0, -0.5]},
}


def schema_validator() -> Callable[[Any], list[str]] | None:
    """The report schema's check (``protocol/schemas``) for :func:`check_encoding`.

    Returns:
        A function of a decoded report giving at most two of its schema errors, each a short
        line (``differences.schema_lines``; none for a valid report), or ``None`` without the
        ``conformance`` extra (jsonschema). Errors on the fields the every-report rules judge
        (``report_rules.RULED_FIELDS``) are left to them, so that each is said once a run.
    """
    try:
        from jsonschema import Draft202012Validator  # type: ignore[import-untyped,unused-ignore]
    except ImportError:  # the conformance extra is not installed
        return None
    from async_task_api_worker.protocol.schemas import load_schema

    validator = Draft202012Validator(load_schema("report"))
    return lambda document: schema_lines(validator.iter_errors(document), leave=RULED_FIELDS)


def check_encoding(
    found: Findings, seen: Seen, service: str, validate: Callable[[Any], list[str]] | None
) -> tuple[int, int] | None:
    """Check one report's bytes and properties; returns its ``(attempt, seq)`` when readable."""
    document = seen.document
    label = f"{seen.properties.get('message_id')}"
    if document is None:
        found.problems.append(f"{label}: the body is not a JSON object")
        return None
    canonical = canonical_dumps(document)
    found.expect(
        canonical == seen.body,
        f"{label}: not the canonical encoding (key order, separators, number or string forms): "
        f"{byte_difference(canonical, seen.body)}",
    )
    if validate is not None:
        # The schema's verdict as any validator gives it, on the body read the usual way: it
        # takes 1.0 for an integer, and the number types are report_rules' to judge.
        errors = validate(strict_loads(seen.body.decode()))
        found.expect(
            not errors, f"{label}: not valid against report.schema.json: {'; '.join(errors)}"
        )
    props = seen.properties
    kind = document.get("type")
    tid = document.get("task_id")
    expected = {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "delivery_mode": 2,
        "correlation_id": tid,
        "type": kind,
        "app_id": service,
    }
    for name, value in expected.items():
        found.expect(props.get(name) == value, f"{label}: {name} is {props.get(name)!r}")
    found.expect(
        document.get("service") == service, f"{label}: service is {document.get('service')!r}"
    )
    # The timestamp's form is report_rules' to judge; any time with an offset is compared here.
    moment = _moment(document.get("timestamp"))
    if moment is not None:
        seconds = int(moment.timestamp())
        found.expect(
            props.get("timestamp") == seconds,
            f"{label}: AMQP timestamp {props.get('timestamp')} is not {seconds} (whole seconds "
            f"since the epoch, not milliseconds)",
        )
    attempt = document.get("attempt")
    if not isinstance(attempt, int) or isinstance(attempt, bool):
        return None  # the attempt's type is report_rules' to judge, once a run
    message_id = str(props.get("message_id"))
    head, _, seq = message_id.rpartition("/")
    if found.expect(
        head == f"{tid}/{attempt}" and seq.isdigit(),
        f"{label}: message_id is not <task_id>/<attempt>/<seq>",
    ):
        return attempt, int(seq)
    return None


def _moment(stamp: object) -> datetime | None:
    """``stamp`` read as an ISO 8601 time with an offset; ``None`` when it is not one."""
    if not isinstance(stamp, str):
        return None
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


async def encoding(wire: Wire, setup: Setup, found: Findings) -> None:
    """Every report byte-exact, schema-valid, with the protocol's AMQP properties.

    docs/protocol.md, "Canonical encoding" and "AMQP properties": sorted keys, no white space,
    numbers and strings in their one form; ``message_id`` ``<task>/<attempt>/<seq>`` with
    ``seq`` growing from 0; the response and payload exactly what the handler returned.
    """
    payload = {"k": 0.5, "j": "ü", "i": [1, 2.0]}
    message = 'a message with ünïcödé, a quote " and a newline \n'
    tasks: dict[str, dict[str, Any]] = {
        task_id(setup, "encoding", 1): {"behaviour": "succeed", "output": _TRICKY_OUTPUT},
        task_id(setup, "encoding", 2): {
            "behaviour": "fail",
            "code": "CONFORMANCE_CODE",
            "message": message,
        },
        task_id(setup, "encoding", 3): {
            "behaviour": "progress",
            "fractions": [0.25],
            "payload": payload,
            "output": {"done": True},
        },
        task_id(setup, "encoding", 4): {
            "behaviour": "fail",
            "code": "CONFORMANCE_CODE",
            "message": LONG_MESSAGE,
        },
    }
    for tid, task_input in tasks.items():
        await wire.publish(envelope(setup, tid, task_input), message_id=tid)
    validate = schema_validator()
    if validate is None:
        found.notes.append("schema not checked: install the conformance extra (jsonschema)")
    count = 0
    for tid, task_input in tasks.items():
        reports = await wire.wait_terminal(tid)
        found.expect(terminal(reports) is not None, f"{tid}: no terminal report")
        if task_input["behaviour"] == "progress":
            # A held update goes out before the terminal report: one at least is published.
            found.expect(
                any(seen.type == "progress" for seen in reports), f"{tid}: no progress report"
            )
        last: tuple[int, int] | None = None
        for seen in reports:
            count += 1
            position = check_encoding(found, seen, setup.service, validate)
            if position is not None and last is not None and position[0] == last[0]:
                found.expect(position[1] > last[1], f"{tid}: seq does not grow")
            last = position or last
            document = seen.document or {}
            if seen.type == "success":
                wrong = value_difference(
                    task_input.get("output", {}), document.get("response", MISSING), "response"
                )
                found.expect(
                    wrong is None,
                    f"{tid}: the response is not the output, value for value and type for type: "
                    f"{wrong}",
                )
            if seen.type == "progress":
                reported = {"fraction": 0.25, "payload": payload}
                sent = {key: document.get(key, MISSING) for key in reported}
                wrong = value_difference(reported, sent, "", "reported")
                found.expect(
                    wrong is None,
                    f"{tid}: the progress report is not the fraction and payload reported: {wrong}",
                )
            if seen.type == "failure" and task_input["behaviour"] == "fail":
                error = document.get("error")
                error = error if isinstance(error, dict) else {}
                found.expect(
                    error.get("code") == "CONFORMANCE_CODE" and error.keys() == {"code", "message"},
                    f"{tid}: the error is not the handler's code and a message",
                )
                problem = cut_problem(task_input["message"], error.get("message"))
                found.expect(problem is None, f"{tid}: {problem}")
        if reports:
            found.expect(
                reports[0].properties.get("message_id") == f"{tid}/1/0",
                f"{tid}: the first report's message_id is not {tid}/1/0",
            )
    found.notes.append(f"{count} reports checked byte for byte")


# ------------------------------------------------------------------------------- order


async def order(wire: Wire, setup: Setup, found: Findings) -> None:
    """``started`` once and first, progress non-decreasing and throttled, one terminal, no more.

    docs/protocol.md, "Reports" and "Ordering and duplicates". A held update may be flushed
    right before the terminal report, so the spacing is checked between the others. The rapid
    task's last update is 1.0, out of range: it is never reported.
    """
    interval = setup.progress_interval_s
    # The last update is 1.0, which a worker never reports (the terminal report is the 100 %):
    # every report's fraction is checked to be below 1 (conformance.report_rules).
    rapid = [round(0.1 * step, 1) for step in range(1, 11)]
    spaced = [0.2, 0.4, 0.6]
    tasks: dict[str, dict[str, Any]] = {
        task_id(setup, "order", 1): {"behaviour": "progress", "fractions": rapid},
        task_id(setup, "order", 2): {
            "behaviour": "progress",
            "fractions": spaced,
            "interval_s": round(interval * 0.6, 3),
        },
        # One update of 0.0, held and flushed before the terminal report: a worker whose
        # writer drops an integral float's ".0" (JavaScript's JSON.stringify) writes 0, which
        # conformance.report_rules refuses.
        task_id(setup, "order", 3): {"behaviour": "progress", "fractions": [0.0]},
    }
    for tid, task_input in tasks.items():
        await wire.publish(envelope(setup, tid, task_input), message_id=tid)
    for tid, task_input in tasks.items():
        reports = await wire.wait_terminal(tid, settle_s=max(SETTLE_S, interval / 2))
        types = [seen.type for seen in reports]
        found.notes.append(f"{tid}: {kinds(reports)}")
        if not found.expect(bool(reports), f"{tid}: no report"):
            continue
        found.expect(types[0] == "started", f"{tid}: the first report is {types[0]}")
        found.expect(
            types.count("started") == 1,
            f"{tid}: {types.count('started')} started reports in one delivery, not one",
        )
        terminals = [i for i, seen in enumerate(reports) if seen.terminal]
        if not found.expect(len(terminals) == 1, f"{tid}: {len(terminals)} terminal reports"):
            continue
        found.expect(
            terminals[0] == len(reports) - 1,
            f"{tid}: {types[terminals[0] + 1 :]} after the terminal report",
        )
        progress = [seen for seen in reports[: terminals[0]] if seen.type == "progress"]
        found.expect(
            all(seen.type in ("started", "progress") for seen in reports[1 : terminals[0]]),
            f"{tid}: unexpected reports before the terminal one: {types}",
        )
        fractions: list[Any] = [(seen.document or {}).get("fraction") for seen in progress]
        found.expect(
            all(f in task_input["fractions"] for f in fractions) and fractions == sorted(fractions),
            f"{tid}: progress fractions {fractions} are not the reported ones in order",
        )
        stamps = [datetime.fromisoformat((seen.document or {})["timestamp"]) for seen in progress]
        # The last one may be a held update flushed ahead of the terminal report.
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(stamps[:-1])]
        found.expect(
            all(gap >= interval * 0.9 for gap in gaps),
            f"{tid}: progress reports {gaps} s apart, less than {interval} s",
        )
        if task_input["fractions"] is rapid:
            found.expect(
                len(progress) <= 2,
                f"{tid}: {len(progress)} progress reports for {len(rapid)} updates made at once "
                f"(throttled: at most one per {interval} s, and a last one flushed)",
            )
