r"""Write the protocol's golden vectors and their manifest, the conformance kit's data.

They are package data, under ``src/async_task_api_worker/conformance/vectors/`` (read through
``async_task_api_worker.conformance.golden``; docs/conformance.md, "The golden vectors").

Usage::

    uv run python scripts/generate_vectors.py          # (re)write the vectors
    uv run python scripts/generate_vectors.py --check  # exit 1 if a committed vector differs

Three kinds (docs/protocol.md, "Golden vectors"):

- ``reports/NNN-name.json``: ``{"description", "seq", "report", "properties"}``: a report's
  fields, the ``seq`` it is published with, and its expected AMQP properties;
  ``reports/NNN-name.bin``: the exact canonical bytes ``encode_report`` must produce.
- ``envelopes/NNN-name.bin``: an inbound body; ``envelopes/NNN-name.json``: what decoding it
  gives, either ``{"envelope": {...}}`` (the decoded fields, as ``model_dump(mode="json")``) or
  ``{"poison": reason, "task_id": ..., "client_id": ...}``; plus ``max_body_bytes`` when the
  case needs a limit other than the default, ``worker_service`` when the worker's own name
  matters, ``schema_valid``: whether the body, read as JSON, passes envelope.schema.json
  (``null`` when it is not JSON at all), and ``schema_valid_formats``: the same with the
  schema's formats enforced (``date-time``, by RFC 3339).
- ``cancels/NNN-name.bin``: a cancel request's body; ``cancels/NNN-name.json``: what decoding it
  gives, either ``{"cancel": {...}, "canonical": bool}`` (the decoded fields; ``canonical``:
  whether ``encode_cancel`` of those fields gives the ``.bin``, then with its ``properties``) or
  ``{"refused": reason}``; plus ``schema_valid`` and ``schema_valid_formats`` against
  cancel.schema.json, as above.
- ``manifest.json``: every vector's kind, id, two files, description, the rule it pins (a
  docs/protocol.md section title, from :class:`Section`, and a phrase) and what it expects in
  brief; the shape is in ``conformance/golden.py``. It is written from the same case table.

Every case states what it expects (the poison reason, the schema verdict) and the rule it pins;
the generator stops if the code disagrees, or if a section is not a title of docs/protocol.md,
so a regenerated vector never silently records a regression. The tests read the committed files
and never call this script.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from pydantic import TypeAdapter

from async_task_api_worker.conformance.golden import FOLDERS, FORMAT_VERSION, MANIFEST_NAME
from async_task_api_worker.errors import CancelDecodeError, EnvelopeDecodeError, ReportEncodeError
from async_task_api_worker.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_CANCEL_BYTES,
    RESERVED_ERROR_CODES,
    CancelDecodeReason,
    ErrorCode,
    PoisonReason,
    Report,
    decode_cancel,
    decode_envelope,
    encode_cancel,
    encode_report,
)
from async_task_api_worker.protocol.cancel import TASK_CANCELLED_MESSAGE
from async_task_api_worker.protocol.encoding import strict_loads
from async_task_api_worker.protocol.reports import MessageProperties
from async_task_api_worker.protocol.schemas import load_schema
from async_task_api_worker.task_call import unreportable

ROOT = Path(__file__).resolve().parent.parent
# The source tree, not vector_root(): an installed (non-editable) package is not written to.
VECTOR_DIR = ROOT / "src" / "async_task_api_worker" / "conformance" / "vectors"
REPORT_DIR = VECTOR_DIR / FOLDERS["report"]
ENVELOPE_DIR = VECTOR_DIR / FOLDERS["envelope"]
CANCEL_DIR = VECTOR_DIR / FOLDERS["cancel"]
PROTOCOL_DOC = ROOT / "docs" / "protocol.md"


class Section(StrEnum):
    """The docs/protocol.md section titles a vector may pin (the manifest's ``sections``)."""

    VERSIONING = "Versioning"
    ENVELOPE = "The envelope"
    DECODING = "Decoding and poison messages"
    REPORTS = "Reports"
    PROPERTIES = "AMQP properties"
    ERROR_CODES = "Error codes"
    ENCODING = "Canonical encoding"
    CANCELLING = "Cancelling a task"


HOW_TO_USE = (
    "Paths are relative to this file. For each report vector: build the report from the .json's "
    "report, encode it with its seq, and compare with the .bin byte for byte and with the "
    ".json's properties. For each envelope vector: decode the .bin (with max_body_bytes and as "
    "the worker worker_service when the .json gives them) and compare with the .json's envelope, "
    "or its poison, task_id and client_id. For each cancel vector: decode the .bin and compare "
    "with the .json's cancel, or its refused reason; when canonical is true, also encode the "
    "cancel's fields and compare with the .bin byte for byte and with the .json's properties. "
    "Skip a kind you do not know. "
    'docs/conformance.md, "The golden vectors".'
)

_REPORT_ADAPTER: TypeAdapter[Any] = TypeAdapter(Report)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

# ---------------------------------------------------------------------------------------------
# report cases

TS = "2026-11-29T22:48:46.123456Z"


def _report(kind: str, **fields: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "protocol_version": 1,
        "type": kind,
        "task_id": "t-0001",
        "client_id": "client-a",
        "service": "resize",
        "attempt": 1,
        "timestamp": TS,
    }
    document.update(fields)
    if kind == "progress":
        document.setdefault("payload", None)
    return document


def _success(response: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return _report("success", response=response, **fields)


def _failure(code: str, message: str, **fields: Any) -> dict[str, Any]:
    return _report("failure", error={"code": code, "message": message}, **fields)


def _refused_success(response: dict[str, Any]) -> dict[str, Any]:
    """The failure a worker publishes instead of a success whose response no report carries."""
    try:
        encode_report(_REPORT_ADAPTER.validate_python(_success(response)))
    except ReportEncodeError as exc:
        failure = unreportable(exc)
        return _failure(failure.code, failure.message)
    raise SystemExit(f"the encoder took a response it should refuse: {response!r}")


def _nested(levels: int) -> Any:
    value: Any = "bottom"
    for level in range(levels):
        value = {"level": level, "next": value} if level % 2 else [value]
    return value


@dataclass(frozen=True)
class ReportCase:
    """One report vector: its fields and the ``seq`` it is encoded with."""

    slug: str
    description: str
    report: dict[str, Any]
    seq: int = 0
    section: Section = field(kw_only=True)
    rule: str = field(kw_only=True)


# The messages below are those the engine publishes for each code (engine.py), where it has one.
_FAILURES: dict[ErrorCode, tuple[str, dict[str, Any]]] = {
    ErrorCode.INVALID_INPUT: ("invalid input: width: missing; height: int_type", {}),
    ErrorCode.TASK_TIMEOUT: ("the task did not finish within 30 s", {}),
    ErrorCode.INTERNAL_ERROR: ("the task failed with an internal error", {}),
    ErrorCode.TASK_ABANDONED_AFTER_REDELIVERIES: (
        "the task was delivered 6 times, more than its limit of 5; it was not run again",
        {"attempt": 6},
    ),
    ErrorCode.POISON_MESSAGE: (
        "the message was refused: invalid_envelope: invalid envelope: input: missing",
        {},
    ),
    ErrorCode.INVALID_RESULT: (
        "the handler's result failed its output model: url: string_type",
        {},
    ),
    ErrorCode.RESULT_TOO_LARGE: (
        "the handler's result cannot be reported: success report of 16777300 bytes exceeds "
        "16777216 bytes",
        {},
    ),
    ErrorCode.TRANSIENT_ERROR: ("The task failed with a transient error.", {"attempt": 5}),
    ErrorCode.WORKER_CRASHED: ("the task's process was killed by signal 9", {}),
    ErrorCode.WORKER_DIED: ("the detached worker left no result before its deadline", {}),
}


def _code_rule(code: ErrorCode) -> str:
    """The rule a failure vector with one of the SDK's codes pins."""
    if code in RESERVED_ERROR_CODES:
        return f"{code.value}: reserved, sent by the SDK only"
    return f"{code.value}: the SDK's code, which handlers may raise too"


REPORT_CASES: list[ReportCase] = [
    ReportCase(
        "started",
        "a started report, first attempt",
        _report("started"),
        section=Section.REPORTS,
        rule="started: every field present, keys in canonical order",
    ),
    ReportCase(
        "started-epoch",
        "started at the Unix epoch: AMQP timestamp 0; attempt 3, seq 0 of that attempt",
        _report("started", attempt=3, timestamp="1970-01-01T00:00:00.000000Z"),
        section=Section.PROPERTIES,
        rule="AMQP timestamp in whole seconds since the epoch; seq counts from 0 per delivery",
    ),
    ReportCase(
        "progress-no-payload",
        "progress without payload: `payload` is still written, as null",
        _report("progress", fraction=0.25),
        seq=1,
        section=Section.REPORTS,
        rule="progress always carries payload, null when there is none",
    ),
    ReportCase(
        "progress-payload",
        "progress with a payload; keys are sorted inside the payload too",
        _report("progress", fraction=0.5, payload={"stage": "encode", "frames": 120, "eta_s": 4.5}),
        seq=2,
        section=Section.ENCODING,
        rule="keys sorted at every level, inside payload too",
    ),
    ReportCase(
        "progress-bounds",
        "fraction 0.0 (written 0.0, not 0) and the AMQP timestamp floored from .999999",
        _report("progress", fraction=0.0, timestamp="2026-11-29T22:48:46.999999Z"),
        seq=1,
        section=Section.REPORTS,
        rule="fraction written as a float (0.0, not 0); AMQP timestamp rounded down",
    ),
    ReportCase(
        "progress-almost-one",
        "the largest double below 1 as a fraction",
        _report("progress", fraction=0.9999999999999999, payload={}),
        seq=7,
        section=Section.ENCODING,
        rule="floats: the shortest digits that read back as the same double",
    ),
    ReportCase(
        "success-empty",
        "success with an empty response",
        _success({}),
        seq=1,
        section=Section.REPORTS,
        rule="success with an empty response object",
    ),
    ReportCase(
        "success-literals",
        "every JSON literal and empty containers",
        _success(
            {"t": True, "f": False, "n": None, "s": "", "a": [], "o": {}, "z": 0, "m": [None, 1]}
        ),
        seq=1,
        section=Section.ENCODING,
        rule="literals true, false, null; empty array and object",
    ),
    ReportCase(
        "success-nested",
        "nested objects and arrays: keys sorted at every level, array order kept",
        _success(
            {
                "zeta": {"b": [3, 2, 1], "a": {"y": 1, "x": [{"d": 1, "c": 2}]}},
                "alpha": [[], [[]], {"k": {}}],
                "mid": {"B": 1, "a": 2, "_": 3, "0": 4},
            }
        ),
        seq=1,
        section=Section.ENCODING,
        rule="keys sorted at every level, array order kept, no white space",
    ),
    ReportCase(
        "success-max-depth",
        "nesting at the limit: 64 levels counting the report object itself",
        _success({"deep": _nested(62)}),
        seq=1,
        section=Section.ENCODING,
        rule="nesting limit: 64 levels counting the report object",
    ),
    ReportCase(
        "success-unicode",
        "accents, combining marks, CJK, Arabic and Hebrew (RTL): raw UTF-8, never \\u escapes",
        _success(
            {
                "fr": "Élève à l'école, garçon, cœur",
                "combining": "e\u0301",
                "zh": "任务已完成",
                "ja": "東京タワー",
                "ar": "مرحبا بالعالم",
                "he": "שלום עולם",
                "mixed": "abc \u202bعربي\u202c def",
            }
        ),
        seq=1,
        section=Section.ENCODING,
        rule="characters written as themselves in UTF-8, never as \\u escapes",
    ),
    ReportCase(
        "success-emoji",
        "astral-plane characters: 4-byte UTF-8, never a surrogate pair of escapes",
        _success(
            {
                "smile": "😀",
                "music": "𝄞",
                "family": "👨\u200d👩\u200d👧",
                "flag": "🇫🇷",
                "keys": {"🔑": "key", "x😀y": 1},
            }
        ),
        seq=1,
        section=Section.ENCODING,
        rule="astral characters as four UTF-8 bytes, never a pair of escapes",
    ),
    ReportCase(
        "success-escapes",
        "the mandatory escapes, and what is NOT escaped: '/', U+007F, U+0085, U+2028, "
        "U+2029, U+FEFF",
        _success(
            {
                "quote": 'say "hi"',
                "backslash": "C:\\temp\\new",
                "slash": "a/b</script>",
                "named": "\b\f\n\r\t",
                "controls": "".join(chr(code) for code in range(0x20)),
                "del": "\x7f",
                "nel": "\x85",
                "line_separators": "\u2028\u2029",
                "bom": "\ufeff",
                "html": "<&'>",
            }
        ),
        seq=1,
        section=Section.ENCODING,
        rule="only the mandatory escapes; '/', U+007F, C1, U+2028, U+FEFF as is",
    ),
    ReportCase(
        "failure-lone-surrogates-in-a-result",
        "a response holding lone surrogates (in a value and in a key) is not sent: the "
        "INVALID_RESULT failure sent instead",
        _refused_success(
            {"high": "a\ud800b", "low": "\udfff", "\udabc": "key", "both": "\udc00\ud800"}
        ),
        seq=1,
        section=Section.ENCODING,
        rule="a response holding a lone surrogate, raw or escaped, is refused: INVALID_RESULT",
    ),
    ReportCase(
        "success-big-integers",
        "integers of any size up to 4,300 digits, in decimal",
        _success(
            {
                "two_200": 2**200,
                "minus_two_200": -(2**200),
                "int64_max": 2**63 - 1,
                "int64_min_minus_1": -(2**63) - 1,
                "uint64_max_plus_1": 2**64,
                "zero": 0,
                "minus_one": -1,
            }
        ),
        seq=1,
        section=Section.ENCODING,
        rule="integers in decimal, of any size up to 4,300 digits",
    ),
    ReportCase(
        "success-floats",
        "floats: shortest round-trip text, .0 kept, exponent below 1e-4 and from 1e16",
        _success(
            {
                "tenth": 0.1,
                "one": 1.0,
                "minus_zero": -0.0,
                "small": 1e-05,
                "just_not_small": 0.0001,
                "big": 1e16,
                "just_not_big": 9999999999999998.0,
                "e15": 1e15,
                "min_subnormal": 5e-324,
                "min_normal": 2.2250738585072014e-308,
                "max": 1.7976931348623157e308,
                "third": 1 / 3,
                "negative": -1.5,
                "point_one_plus_two": 0.1 + 0.2,
                "big_mantissa": 1.2345678901234567e20,
            }
        ),
        seq=1,
        section=Section.ENCODING,
        rule="floats: shortest digits, .0 kept, exponent below 1e-4 and from 1e16",
    ),
    ReportCase(
        "success-key-order",
        "keys in code-point order: U+FF5A before U+1F600, unlike UTF-16 code-unit order",
        _success(
            {
                "😀": "U+1F600",
                "\uff5a": "U+FF5A",
                "\ue000": "U+E000",
                "é": "U+00E9",
                "a": "U+0061",
                "B": "U+0042",
                "": "empty",
                "aa": "two",
                "a b": "space",
                "A": "U+0041",
                "_": "U+005F",
                "~": "U+007E",
            }
        ),
        seq=1,
        section=Section.ENCODING,
        rule="keys sorted by code point, not by UTF-16 code unit",
    ),
    ReportCase(
        "success-long-string",
        "a string of 100,000 characters (133,334 bytes in UTF-8)",
        _success({"text": ("ab€" * 33_334)[:100_000]}),
        seq=1,
        section=Section.ENCODING,
        rule="a long string written whole in UTF-8, no length limit",
    ),
    ReportCase(
        "success-ids",
        "identifiers at their limits: 128-character task id, 64-character service, ._:@- kept",
        _success(
            {"ok": True},
            task_id="T" + "x" * 126 + "9",
            client_id="svc.account:user@example-1_2",
            service="S" + "s" * 62 + "9",
            attempt=2,
        ),
        seq=4,
        section=Section.REPORTS,
        rule="ids and service at their patterns' limits, copied verbatim",
    ),
    *(
        ReportCase(
            f"failure-{code.value.lower().replace('_', '-')}",
            f"a failure report with the SDK code {code.value}",
            _failure(code.value, message, **extra),
            seq=0
            if code
            in (
                ErrorCode.INVALID_INPUT,
                ErrorCode.TASK_ABANDONED_AFTER_REDELIVERIES,
                ErrorCode.POISON_MESSAGE,
            )
            else 1,
            section=Section.ERROR_CODES,
            rule=_code_rule(code),
        )
        for code, (message, extra) in _FAILURES.items()
    ),
    ReportCase(
        "failure-user-code",
        "a failure with a handler's own code (FatalError)",
        _failure("PAYMENT_DECLINED", "the card was declined", attempt=1),
        seq=3,
        section=Section.ERROR_CODES,
        rule="a handler's own code: codes are an open set",
    ),
    ReportCase(
        "failure-poison-no-client-id",
        "a poison body whose task id was recovered but whose client id was not: client_id null",
        _failure(
            "POISON_MESSAGE",
            "the message was refused: invalid_envelope: invalid envelope: client_id: string_type",
            client_id=None,
        ),
        section=Section.DECODING,
        rule="task id recovered, client id not: client_id null",
    ),
    ReportCase(
        "failure-message-lone-surrogate",
        "a message holding a lone surrogate (a file name read with surrogateescape)",
        _failure("FILE_UNREADABLE", "cannot read report-\udcff.csv"),
        seq=1,
        section=Section.ENCODING,
        rule="a lone surrogate in error.message escaped as \\udxxx",
    ),
    ReportCase(
        "failure-long-message",
        "a message of exactly 1,024 characters (the limit), with non-ASCII characters",
        _failure("QUOTA_EXCEEDED", ("quota dépassée — " * 61)[:1024]),
        seq=1,
        section=Section.ERROR_CODES,
        rule="error.message at its limit of 1,024 characters",
    ),
    # Appended rather than added to _FAILURES, whose vectors come before the ones above: a
    # vector's number is its id in other languages' suites, and must not move.
    ReportCase(
        "failure-task-cancelled",
        "a failure report with the SDK code TASK_CANCELLED (a cancel request reached the task)",
        _failure(ErrorCode.TASK_CANCELLED.value, TASK_CANCELLED_MESSAGE),
        seq=1,
        section=Section.ERROR_CODES,
        rule=_code_rule(ErrorCode.TASK_CANCELLED),
    ),
    # Where RFC 8785 (JCS), which lays floats out as ECMAScript's Number.prototype.toString,
    # writes other bytes: from 1e16 to 1e21 (positional there), 1e-5 and 1e-6 (positional
    # there), below 1e-6 (one exponent digit there); and where both agree (docs/protocol.md,
    # "Not RFC 8785 (JCS)").
    ReportCase(
        "success-floats-exponent-layout",
        "floats around the exponent thresholds: e+NN/e-NN, two digits at least, from 1e16 "
        "and below 1e-4; not ECMAScript's (RFC 8785's) layout",
        _success(
            {
                "e16_and_a_half": 1.5e16,
                "e20": 1e20,
                "e21": 1e21,
                "e100": 1e100,
                "two_53": 9007199254740992.0,
                "e_minus_4": 0.0001,
                "e_minus_5_and_a_half": 5.5e-05,
                "e_minus_6": 1e-06,
                "e_minus_7": 1e-07,
                "minus_e_minus_7": -1.25e-07,
                "e_minus_9": 1.5e-09,
                "e_minus_10": 1e-10,
            }
        ),
        seq=1,
        section=Section.ENCODING,
        rule="floats: e+NN/e-NN with two digits at least, not ECMAScript's layout",
    ),
]

# ---------------------------------------------------------------------------------------------
# envelope cases


def _body(**fields: Any) -> bytes:
    document: dict[str, Any] = {
        "protocol_version": 1,
        "task_id": "t-0001",
        "client_id": "client-a",
        "service": "resize",
        "input": {"width": 640},
    }
    document.update(fields)
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _deep_body(levels: int) -> bytes:
    """A body whose ``input`` makes the whole document ``levels`` deep (the object is one)."""
    inner = b"[" * (levels - 2) + b"]" * (levels - 2)
    return (
        b'{"protocol_version":1,"task_id":"t-0001","client_id":"client-a","service":"resize",'
        b'"input":{"x":' + inner + b"}}"
    )


@dataclass(frozen=True)
class EnvelopeCase:
    """One envelope vector: a body and what decoding it must give."""

    slug: str
    description: str
    body: bytes
    poison: PoisonReason | None = None
    schema_valid: bool | None = True
    max_body_bytes: int | None = None
    worker_service: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    section: Section = field(kw_only=True)
    rule: str = field(kw_only=True)
    #: The schema takes the body, but not once its formats are enforced (a date-time).
    refused_by_formats: bool = field(default=False, kw_only=True)


_MINIMAL = _body()
_DIGITS_4300 = "9" * 4300
_DIGITS_5000 = "1" * 5000

ENVELOPE_CASES: list[EnvelopeCase] = [
    EnvelopeCase(
        "minimal",
        "the smallest valid envelope",
        _MINIMAL,
        section=Section.ENVELOPE,
        rule="the required fields only; the optional ones take their defaults",
    ),
    EnvelopeCase(
        "input-refs",
        "input_refs: one with every field, one with only name and uri",
        _body(
            input={},
            input_refs=[
                {
                    "name": "video",
                    "uri": "s3://bucket/videos/in.mp4",
                    "content_type": "video/mp4",
                    "size_bytes": 1_234_567_890_123,
                    "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                },
                {"name": "subtitles", "uri": "https://files.example/s.srt"},
            ],
        ),
        section=Section.ENVELOPE,
        rule="input references: every field, and name and uri only",
    ),
    EnvelopeCase(
        "created-at-z",
        "created_at in UTC with Z",
        _body(created_at="2026-11-29T22:48:46Z"),
        section=Section.ENVELOPE,
        rule="created_at in UTC with Z",
    ),
    EnvelopeCase(
        "created-at-offset-fraction",
        "created_at with +00:00 and nanoseconds: read to the microsecond (truncated)",
        _body(created_at="2026-11-29T22:48:46.123456789+00:00"),
        section=Section.ENVELOPE,
        rule="created_at +00:00 accepted; fraction cut to microseconds",
    ),
    EnvelopeCase(
        "unknown-fields",
        "unknown fields, at the top and in an input ref, are ignored",
        _body(
            priority=5,
            trace={"id": "abc", "sampled": True},
            input_refs=[{"name": "doc", "uri": "file:///d.pdf", "etag": "W/1"}],
        ),
        section=Section.ENVELOPE,
        rule="unknown fields ignored, at the top and in input references",
    ),
    EnvelopeCase(
        "input-unicode-escapes",
        "input strings: raw UTF-8, \\u escapes, an escaped surrogate pair, a lone surrogate",
        b'{"protocol_version":1,"task_id":"t-0001","client_id":"client-a","service":"resize",'
        b'"input":{"raw":"\xc3\xa9\xe4\xbb\xbb\xd8\xb9\xf0\x9f\x98\x80",'
        b'"escaped":"\\u00e9\\u4efb\\u0639\\ud83d\\ude00","lone":"\\udc00",'
        b'"controls":"\\u0000\\b\\t\\/","\\u00e9t\\u00e9":1}}',
        section=Section.ENVELOPE,
        rule="input strings: UTF-8, \\u escapes; a lone surrogate accepted",
    ),
    EnvelopeCase(
        "duplicate-keys",
        "a duplicate key keeps its last value, at the top and in input",
        b'{"protocol_version":1,"task_id":"t-first","client_id":"client-a","service":"resize",'
        b'"input":{"k":1,"k":2},"task_id":"t-last"}',
        section=Section.ENVELOPE,
        rule="a duplicate key keeps its last value, at every level",
    ),
    EnvelopeCase(
        "whitespace",
        "insignificant white space (space, tab, CR, LF) anywhere between tokens",
        b' \r\n{\n\t"protocol_version" : 1 ,\r\n\t"task_id":"t-0001",\n\t"client_id":\t'
        b'"client-a",\n\t"service":"resize",\n\t"input":{ "a" : [ 1 , 2 ] }\n}\n ',
        section=Section.ENVELOPE,
        rule="white space between tokens does not matter",
    ),
    EnvelopeCase(
        "numbers",
        "numbers in input: big and 4,300-digit integers, floats, an underflow read as 0.0",
        b'{"protocol_version":1,"task_id":"t-0001","client_id":"client-a","service":"resize",'
        b'"input":{"big":1606938044258990275541962092341162602522202993782792835301376,'
        b'"neg":-1606938044258990275541962092341162602522202993782792835301376,'
        b'"max_digits":' + _DIGITS_4300.encode() + b","
        b'"f":[0.1,1e-05,1E+16,-0.0,5e-324,1.7976931348623157e308,1e-400,2.5e3,-0]}}',
        section=Section.DECODING,
        rule="integers up to 4,300 digits accepted; an underflow reads as 0.0",
    ),
    EnvelopeCase(
        "depth-64",
        "nesting of exactly 64 levels is accepted",
        _deep_body(64),
        section=Section.DECODING,
        rule="check 5: 64 levels of nesting accepted",
    ),
    EnvelopeCase(
        "id-limits",
        "a 128-character task id, an id with ._:@-, and a 64-character service",
        _body(
            task_id="T" + "x" * 126 + "9",
            client_id="svc.account:user@example-1_2",
            service="S" + "s" * 62 + "9",
        ),
        worker_service="S" + "s" * 62 + "9",
        section=Section.ENVELOPE,
        rule="ids and service at their patterns' limits",
    ),
    EnvelopeCase(
        "size-at-limit",
        "a body exactly as large as max_body_bytes is accepted",
        _MINIMAL,
        max_body_bytes=len(_MINIMAL),
        section=Section.DECODING,
        rule="check 1: a body exactly max_body_bytes long is accepted",
    ),
    # ---- poison bodies
    EnvelopeCase(
        "too-large",
        "one byte over max_body_bytes: refused before parsing, so no task id",
        _MINIMAL,
        poison=PoisonReason.TOO_LARGE,
        max_body_bytes=len(_MINIMAL) - 1,
        section=Section.DECODING,
        rule="check 1: a body over max_body_bytes, refused before parsing",
    ),
    EnvelopeCase(
        "invalid-utf8",
        "a byte sequence that is not UTF-8 (C3 28): no task id",
        _body(input={"name": "PLACEHOLDER"}).replace(b"PLACEHOLDER", b"\xc3\x28"),
        poison=PoisonReason.INVALID_UTF8,
        schema_valid=None,
        section=Section.DECODING,
        rule="check 2: bytes that are not UTF-8",
    ),
    EnvelopeCase(
        "invalid-utf8-surrogate",
        "a surrogate encoded in UTF-8 form (ED A0 80, CESU-8) is not UTF-8",
        _body(input={"name": "PLACEHOLDER"}).replace(b"PLACEHOLDER", b"\xed\xa0\x80"),
        poison=PoisonReason.INVALID_UTF8,
        schema_valid=None,
        section=Section.DECODING,
        rule="check 2: an encoded surrogate (CESU-8) is not UTF-8",
    ),
    EnvelopeCase(
        "bom",
        "a UTF-8 byte-order mark before the JSON text",
        b"\xef\xbb\xbf" + _MINIMAL,
        poison=PoisonReason.INVALID_JSON,
        schema_valid=None,
        section=Section.DECODING,
        rule="check 3: a byte-order mark makes invalid JSON",
    ),
    EnvelopeCase(
        "truncated",
        'truncated JSON ({"a":)',
        b'{"a":',
        poison=PoisonReason.INVALID_JSON,
        schema_valid=None,
        section=Section.DECODING,
        rule="check 3: truncated JSON",
    ),
    EnvelopeCase(
        "trailing-comma",
        "a trailing comma",
        _MINIMAL[:-1] + b",}",
        poison=PoisonReason.INVALID_JSON,
        schema_valid=None,
        section=Section.DECODING,
        rule="check 3: a trailing comma",
    ),
    EnvelopeCase(
        "nan",
        "NaN in input: invalid JSON, so no task id even though the body has one",
        _body(input={"x": "PLACEHOLDER"}).replace(b'"PLACEHOLDER"', b"NaN"),
        poison=PoisonReason.INVALID_JSON,
        schema_valid=None,
        section=Section.DECODING,
        rule="check 3: NaN refused; nothing recovered before check 5",
    ),
    EnvelopeCase(
        "infinity",
        "-Infinity in input",
        _body(input={"x": "PLACEHOLDER"}).replace(b'"PLACEHOLDER"', b"-Infinity"),
        poison=PoisonReason.INVALID_JSON,
        schema_valid=None,
        section=Section.DECODING,
        rule="check 3: -Infinity refused",
    ),
    EnvelopeCase(
        "float-overflow",
        "1e400: valid JSON syntax, but it reads as infinity",
        _body(input={"x": "PLACEHOLDER"}).replace(b'"PLACEHOLDER"', b"1e400"),
        poison=PoisonReason.INVALID_JSON,
        schema_valid=None,
        section=Section.DECODING,
        rule="check 3: a number too large for a double",
    ),
    EnvelopeCase(
        "integer-5000-digits",
        "an integer of 5,000 digits (over 4,300)",
        _body(input={"x": "PLACEHOLDER"}).replace(b'"PLACEHOLDER"', _DIGITS_5000.encode()),
        poison=PoisonReason.INVALID_JSON,
        schema_valid=None,
        section=Section.DECODING,
        rule="check 3: an integer of more than 4,300 digits",
    ),
    EnvelopeCase(
        "raw-control-character",
        "an unescaped control character (U+0001) inside a string",
        _body(input={"x": "PLACEHOLDER"}).replace(b"PLACEHOLDER", b"a\x01b"),
        poison=PoisonReason.INVALID_JSON,
        schema_valid=None,
        section=Section.DECODING,
        rule="check 3: a raw control character inside a string",
    ),
    EnvelopeCase(
        "array",
        "a JSON array holding an envelope: not an object, no task id",
        b"[" + _MINIMAL + b"]",
        poison=PoisonReason.NOT_AN_OBJECT,
        schema_valid=False,
        section=Section.DECODING,
        rule="check 4: the value must be an object",
    ),
    EnvelopeCase(
        "string",
        "a JSON string",
        b'"t-0001"',
        poison=PoisonReason.NOT_AN_OBJECT,
        schema_valid=False,
        section=Section.DECODING,
        rule="check 4: a JSON string is not an object",
    ),
    EnvelopeCase(
        "depth-65",
        "65 levels: too deep, but parsed, so the ids are recovered",
        _deep_body(65),
        poison=PoisonReason.TOO_DEEP,
        section=Section.DECODING,
        rule="check 5: 65 levels is too deep; the ids are recovered",
    ),
    EnvelopeCase(
        "depth-10000",
        "10,000 levels: too deep for the parser, so no task id",
        _deep_body(10_000),
        poison=PoisonReason.TOO_DEEP,
        schema_valid=None,
        section=Section.DECODING,
        rule="check 5: too deep to parse, no ids (the one place implementations differ)",
    ),
    EnvelopeCase(
        "missing-input",
        "no input: invalid envelope, ids recovered",
        b'{"protocol_version":1,"task_id":"t-0001","client_id":"client-a","service":"resize"}',
        poison=PoisonReason.INVALID_ENVELOPE,
        schema_valid=False,
        section=Section.DECODING,
        rule="check 7: a required field missing; the ids are recovered",
    ),
    EnvelopeCase(
        "bad-task-id",
        "a task id with a space: not recoverable, the client id is",
        _body(task_id="t 0001"),
        poison=PoisonReason.INVALID_ENVELOPE,
        schema_valid=False,
        section=Section.DECODING,
        rule="recovering the ids: an invalid task id is lost, the client id kept",
    ),
    EnvelopeCase(
        "input-not-object",
        "input is an array",
        _body(input=[1, 2]),
        poison=PoisonReason.INVALID_ENVELOPE,
        schema_valid=False,
        section=Section.ENVELOPE,
        rule="input must be a JSON object",
    ),
    EnvelopeCase(
        "created-at-not-utc",
        "created_at with a +01:00 offset (the schema's date-time format does not catch it)",
        _body(created_at="2026-11-29T23:48:46+01:00"),
        poison=PoisonReason.INVALID_ENVELOPE,
        section=Section.ENVELOPE,
        rule="created_at must be UTC: another offset is refused",
    ),
    EnvelopeCase(
        "created-at-no-offset",
        "created_at without an offset (the schema catches it only with its formats enforced)",
        _body(created_at="2026-11-29T22:48:46"),
        poison=PoisonReason.INVALID_ENVELOPE,
        section=Section.ENVELOPE,
        rule="created_at needs Z or an offset",
        refused_by_formats=True,
    ),
    EnvelopeCase(
        "created-at-number",
        "created_at as a number of seconds",
        _body(created_at=1_795_992_526),
        poison=PoisonReason.INVALID_ENVELOPE,
        schema_valid=False,
        section=Section.ENVELOPE,
        rule="created_at is a string, never a number",
    ),
    EnvelopeCase(
        "version-true",
        "protocol_version true: equal to 1 in some languages, but not the integer 1",
        _body(protocol_version=True),
        poison=PoisonReason.INVALID_ENVELOPE,
        schema_valid=False,
        section=Section.ENVELOPE,
        rule="protocol_version is exactly the integer 1: true is refused",
    ),
    EnvelopeCase(
        "version-string",
        'protocol_version "1"',
        _body(protocol_version="1"),
        poison=PoisonReason.INVALID_ENVELOPE,
        schema_valid=False,
        section=Section.ENVELOPE,
        rule='protocol_version is exactly the integer 1: "1" is refused',
    ),
    EnvelopeCase(
        "version-float",
        "protocol_version 1.0 (JSON Schema counts it an integer; the decoder does not)",
        _body(protocol_version=1.0),
        poison=PoisonReason.INVALID_ENVELOPE,
        section=Section.ENVELOPE,
        rule="protocol_version is exactly the integer 1: 1.0 is refused",
    ),
    EnvelopeCase(
        "unsupported-version",
        "protocol_version 2",
        _body(protocol_version=2, input={"width": 640, "new_field": True}),
        poison=PoisonReason.UNSUPPORTED_VERSION,
        schema_valid=False,
        section=Section.VERSIONING,
        rule="another integer protocol_version is unsupported_version",
    ),
    EnvelopeCase(
        "unsupported-version-partial",
        "protocol_version 2 wins over the other problems; the task id is recovered",
        b'{"protocol_version":2,"task_id":"t-0001"}',
        poison=PoisonReason.UNSUPPORTED_VERSION,
        schema_valid=False,
        section=Section.DECODING,
        rule="check 6 before check 7: unsupported_version, task id recovered",
    ),
    EnvelopeCase(
        "wrong-service",
        "a valid envelope for another service than the consuming worker's",
        _body(service="thumbnail"),
        poison=PoisonReason.WRONG_SERVICE,
        worker_service="resize",
        section=Section.DECODING,
        rule="check 8: service must be the consuming worker's name",
    ),
]

# ---------------------------------------------------------------------------------------------
# cancel cases


def _cancel(**fields: Any) -> bytes:
    """A cancel request's body: the minimal request with ``fields`` changed, in canonical order.

    A field set to ``None`` is left out.
    """
    document: dict[str, Any] = {
        "protocol_version": 1,
        "type": "cancel",
        "task_id": "t-0001",
        "client_id": "client-a",
        "timestamp": TS,
    }
    document.update(fields)
    present = {key: value for key, value in document.items() if value is not None}
    return json.dumps(present, separators=(",", ":"), sort_keys=True).encode("utf-8")


def _cancel_of_size(size: int) -> bytes:
    """A valid cancel request exactly ``size`` bytes long: an unknown field pads it."""
    bare = _cancel(padding="")
    return _cancel(padding="x" * (size - len(bare)))


@dataclass(frozen=True)
class CancelCase:
    """One cancel vector: a body and what decoding it must give.

    ``canonical``: the body is what ``encode_cancel`` writes for the fields it decodes to (the
    generator checks it either way).
    """

    slug: str
    description: str
    body: bytes
    refused: CancelDecodeReason | None = None
    canonical: bool = False
    schema_valid: bool | None = True
    section: Section = field(kw_only=True)
    rule: str = field(kw_only=True)
    #: The schema takes the body, but not once its formats are enforced (a date-time).
    refused_by_formats: bool = field(default=False, kw_only=True)


_MAX_ID = "T" + "x" * 126 + "9"
_MAX_CLIENT_ID = "C" + ("a._:@-" * 21) + "9"

CANCEL_CASES: list[CancelCase] = [
    CancelCase(
        "minimal",
        "a cancel request as encode_cancel writes it",
        _cancel(),
        canonical=True,
        section=Section.CANCELLING,
        rule="the five fields in the canonical encoding: keys sorted, no white space",
    ),
    CancelCase(
        "id-limits",
        "task id and client id of 128 characters, the client id with every allowed punctuation",
        _cancel(task_id=_MAX_ID, client_id=_MAX_CLIENT_ID),
        canonical=True,
        section=Section.CANCELLING,
        rule="task_id and client_id follow the envelope's id pattern, up to 128 characters",
    ),
    CancelCase(
        "unknown-fields",
        "unknown fields, another key order and white space: decoded, not canonical",
        b'{ "type": "cancel", "reason": "the user closed the page",\n'
        b'  "task_id": "t-0001", "client_id": "client-a", "extra": {"nested": [1, 2.5, null]},\n'
        b'  "timestamp": "2026-11-29T22:48:46.123456Z", "protocol_version": 1 }\n',
        section=Section.CANCELLING,
        rule="unknown fields are ignored; key order and white space do not matter",
    ),
    CancelCase(
        "timestamp-floor",
        "a timestamp at .999999 of the epoch's first second: AMQP timestamp 0",
        _cancel(timestamp="1970-01-01T00:00:00.999999Z"),
        canonical=True,
        section=Section.CANCELLING,
        rule="AMQP timestamp: the request's timestamp in whole seconds, rounded down",
    ),
    CancelCase(
        "size-at-limit",
        f"a body of exactly {MAX_CANCEL_BYTES:,} bytes (an unknown field pads it) is accepted",
        _cancel_of_size(MAX_CANCEL_BYTES),
        section=Section.CANCELLING,
        rule="check 1: a body of at most 65,536 bytes; equal is fine",
    ),
    # ---- refused bodies
    CancelCase(
        "too-large",
        f"a valid request of {MAX_CANCEL_BYTES + 1:,} bytes, one over the limit",
        _cancel_of_size(MAX_CANCEL_BYTES + 1),
        refused=CancelDecodeReason.TOO_LARGE,
        section=Section.CANCELLING,
        rule="check 1: a body over 65,536 bytes is refused before parsing",
    ),
    CancelCase(
        "invalid-utf8",
        "a byte sequence that is not UTF-8 (C3 28) inside an unknown field",
        _cancel(note="PLACEHOLDER").replace(b"PLACEHOLDER", b"\xc3("),
        refused=CancelDecodeReason.INVALID_UTF8,
        schema_valid=None,
        section=Section.CANCELLING,
        rule="check 2: the bytes are UTF-8",
    ),
    CancelCase(
        "not-json",
        "plain text",
        b"cancel t-0001",
        refused=CancelDecodeReason.INVALID_JSON,
        schema_valid=None,
        section=Section.CANCELLING,
        rule="check 3: the text is strict JSON",
    ),
    CancelCase(
        "not-an-object",
        "a JSON array holding a valid request",
        b"[" + _cancel() + b"]",
        refused=CancelDecodeReason.NOT_AN_OBJECT,
        schema_valid=False,
        section=Section.CANCELLING,
        rule="check 4: the value is an object",
    ),
    CancelCase(
        "too-deep",
        "an unknown field nesting the body 65 levels deep (the schema does not count levels)",
        _cancel(note="PLACEHOLDER").replace(b'"PLACEHOLDER"', b"[" * 64 + b"]" * 64),
        refused=CancelDecodeReason.TOO_DEEP,
        section=Section.CANCELLING,
        rule="check 5: at most 64 levels, unknown fields included",
    ),
    CancelCase(
        "version-2",
        "protocol_version 2",
        _cancel(protocol_version=2),
        refused=CancelDecodeReason.UNSUPPORTED_VERSION,
        schema_valid=False,
        section=Section.CANCELLING,
        rule="check 6: another integer protocol_version is unsupported_version",
    ),
    CancelCase(
        "wrong-type",
        'type "started": not a cancel request',
        _cancel(type="started"),
        refused=CancelDecodeReason.INVALID_CANCEL,
        schema_valid=False,
        section=Section.CANCELLING,
        rule='check 7: type is exactly "cancel"',
    ),
    CancelCase(
        "bad-task-id",
        "a task id with a space",
        _cancel(task_id="t 0001"),
        refused=CancelDecodeReason.INVALID_CANCEL,
        schema_valid=False,
        section=Section.CANCELLING,
        rule="check 7: task_id follows the id pattern",
    ),
    CancelCase(
        "missing-timestamp",
        "no timestamp",
        _cancel(timestamp=None),
        refused=CancelDecodeReason.INVALID_CANCEL,
        schema_valid=False,
        section=Section.CANCELLING,
        rule="check 7: timestamp is required",
    ),
    CancelCase(
        "timestamp-no-fraction",
        "a timestamp without its six fraction digits (an RFC 3339 time, but not the reports' form)",
        _cancel(timestamp="2026-11-29T22:48:46Z"),
        refused=CancelDecodeReason.INVALID_CANCEL,
        schema_valid=False,
        section=Section.CANCELLING,
        rule="check 7: timestamp in the reports' form, six fraction digits and Z",
    ),
]

# ---------------------------------------------------------------------------------------------
# writing


def dump_json(document: Any) -> bytes:
    """Return a vector's ``.json`` text: 2-space indent, UTF-8, lone surrogates escaped."""
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    text = _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
    return text.encode("utf-8")


def _entry(
    kind: str, number: int, case: ReportCase | EnvelopeCase | CancelCase, expect: str
) -> dict[str, Any]:
    """A vector's manifest entry (the shape in ``conformance/golden.py``)."""
    if not case.rule.strip():
        raise SystemExit(f"{case.slug}: no rule")
    vector_id = f"{number:03d}-{case.slug}"
    stem = f"{FOLDERS[kind]}/{vector_id}"
    return {
        "kind": kind,
        "id": vector_id,
        "json": f"{stem}.json",
        "bin": f"{stem}.bin",
        "description": case.description,
        "rule": {"section": case.section.value, "text": case.rule},
        "expect": expect,
    }


def _properties(properties: MessageProperties) -> dict[str, Any]:
    """The AMQP properties a vector records (``timestamp`` in seconds)."""
    return dict(properties.recorded())


def _report_files(number: int, case: ReportCase) -> tuple[dict[str, bytes], dict[str, Any]]:
    report = _REPORT_ADAPTER.validate_python(case.report)
    encoded = encode_report(report, seq=case.seq)
    document = {
        "description": case.description,
        "seq": case.seq,
        "report": case.report,
        "properties": _properties(encoded.properties),
    }
    entry = _entry("report", number, case, f"{report.type} report bytes")
    files = {entry["json"]: dump_json(document), entry["bin"]: encoded.body}
    return files, entry


def _format_checker() -> FormatChecker:
    """The format checker of jsonschema, whose ``date-time`` is RFC 3339's (rfc3339-validator).

    Without that package jsonschema checks no ``date-time`` at all, and every verdict with
    formats enforced would silently be the one without.
    """
    checker = Draft202012Validator.FORMAT_CHECKER
    if "date-time" not in checker.checkers:
        raise SystemExit("jsonschema cannot check date-time: install rfc3339-validator")
    return checker


def _schema_verdicts(
    case: EnvelopeCase | CancelCase, schema: str, document: dict[str, Any]
) -> None:
    """Record ``schema_valid`` and ``schema_valid_formats`` in ``document``, as ``case`` says.

    Each is whether the body, read as JSON, passes ``<schema>.schema.json`` (without, then
    with its formats enforced); ``None`` if it is not protocol JSON.
    """
    plain: bool | None = None
    formats: bool | None = None
    try:
        body = strict_loads(case.body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        pass
    else:
        loaded = load_schema(schema)
        plain = Draft202012Validator(loaded).is_valid(body)
        formats = Draft202012Validator(loaded, format_checker=_format_checker()).is_valid(body)
    expected = case.schema_valid
    expected_formats = expected and not case.refused_by_formats
    if (plain, formats) != (expected, expected_formats):
        raise SystemExit(
            f"{case.slug}: schema verdict {plain}, {formats} with formats enforced; "
            f"expected {expected}, {expected_formats}"
        )
    document["schema_valid"] = plain
    document["schema_valid_formats"] = formats


def _schema_phrase(document: dict[str, Any]) -> str:
    """The schema's two verdicts, as the manifest's ``expect`` ends.

    ``; schema: valid, with formats: invalid``, or ``; schema: not JSON`` (the ``.json``'s
    ``schema_valid`` and ``schema_valid_formats``).
    """
    plain, formats = document["schema_valid"], document["schema_valid_formats"]
    if plain is None:
        return "; schema: not JSON"
    words = {True: "valid", False: "invalid"}
    return f"; schema: {words[plain]}, with formats: {words[formats]}"


def _envelope_files(number: int, case: EnvelopeCase) -> tuple[dict[str, bytes], dict[str, Any]]:
    limit = case.max_body_bytes or DEFAULT_MAX_BODY_BYTES
    document: dict[str, Any] = {"description": case.description}
    if case.max_body_bytes is not None:
        document["max_body_bytes"] = case.max_body_bytes
    if case.worker_service is not None:
        document["worker_service"] = case.worker_service
    _schema_verdicts(case, "envelope", document)
    try:
        envelope = decode_envelope(case.body, max_body_bytes=limit)
        if case.worker_service is not None and envelope.service != case.worker_service:
            raise EnvelopeDecodeError(
                PoisonReason.WRONG_SERVICE,
                "another service",
                task_id=envelope.task_id,
                client_id=envelope.client_id,
            )
    except EnvelopeDecodeError as exc:
        if exc.reason != case.poison:
            raise SystemExit(f"{case.slug}: poison {exc.reason}, expected {case.poison}") from None
        document.update(poison=exc.reason, task_id=exc.task_id, client_id=exc.client_id)
        recovered = "task id recovered" if exc.task_id is not None else "no task id"
        expect = f"poison {exc.reason.value}, {recovered}"
    else:
        if case.poison is not None:
            raise SystemExit(f"{case.slug}: decoded, expected poison {case.poison}")
        document["envelope"] = envelope.model_dump(mode="json")
        expect = "decodes to the recorded envelope"
    entry = _entry("envelope", number, case, expect + _schema_phrase(document))
    return {entry["json"]: dump_json(document), entry["bin"]: case.body}, entry


def _cancel_files(number: int, case: CancelCase) -> tuple[dict[str, bytes], dict[str, Any]]:
    document: dict[str, Any] = {"description": case.description}
    _schema_verdicts(case, "cancel", document)
    try:
        request = decode_cancel(case.body)
    except CancelDecodeError as exc:
        if exc.reason != case.refused:
            expected = case.refused
            raise SystemExit(f"{case.slug}: refused {exc.reason}, expected {expected}") from None
        document["refused"] = exc.reason
        expect = f"refused {exc.reason}"
    else:
        if case.refused is not None:
            raise SystemExit(f"{case.slug}: decoded, expected refused {case.refused}")
        document["cancel"] = request.model_dump(mode="json")
        body, properties = encode_cancel(request.task_id, request.client_id, request.requested_at)
        if (body == case.body) != case.canonical:
            raise SystemExit(f"{case.slug}: canonical is {body == case.body}, not {case.canonical}")
        document["canonical"] = case.canonical
        if case.canonical:
            document["properties"] = _properties(properties)
            expect = "encodes to the .bin and decodes to the recorded cancel"
        else:
            expect = "decodes to the recorded cancel"
    entry = _entry("cancel", number, case, expect + _schema_phrase(document))
    return {entry["json"]: dump_json(document), entry["bin"]: case.body}, entry


def _sections_are_titles() -> None:
    """Stop unless every :class:`Section` is a title of docs/protocol.md (tests never read it)."""
    titles = {
        line.lstrip("#").strip()
        for line in PROTOCOL_DOC.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }
    missing = [section.value for section in Section if section.value not in titles]
    if missing:
        raise SystemExit(f"not a section title of docs/protocol.md: {', '.join(missing)}")


def dump_manifest(entries: list[dict[str, Any]]) -> bytes:
    """Return ``manifest.json``: sorted keys, 2-space indent, UTF-8, a final newline."""
    used = {entry["rule"]["section"] for entry in entries}
    unused = [section.value for section in Section if section.value not in used]
    if unused:
        raise SystemExit(f"no vector pins the section(s) {', '.join(unused)}")
    document = {
        "format_version": FORMAT_VERSION,
        "how_to_use": HOW_TO_USE,
        "sections": [section.value for section in Section],
        "vectors": sorted(entries, key=lambda entry: str(entry["json"])),
    }
    return (json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def generated_files() -> dict[str, bytes]:
    """Return every file's path (relative to ``VECTOR_DIR``) and expected bytes, manifest too."""
    _sections_are_titles()
    files: dict[str, bytes] = {}
    entries: list[dict[str, Any]] = []
    for number, report_case in enumerate(REPORT_CASES, start=1):
        report_files, entry = _report_files(number, report_case)
        files.update(report_files)
        entries.append(entry)
    for number, envelope_case in enumerate(ENVELOPE_CASES, start=1):
        envelope_files, entry = _envelope_files(number, envelope_case)
        files.update(envelope_files)
        entries.append(entry)
    for number, cancel_case in enumerate(CANCEL_CASES, start=1):
        cancel_files, entry = _cancel_files(number, cancel_case)
        files.update(cancel_files)
        entries.append(entry)
    files[MANIFEST_NAME] = dump_manifest(entries)
    return files


def main(argv: list[str] | None = None) -> int:
    """Write the vectors and the manifest, or with ``--check`` compare them; return the status."""
    parser = argparse.ArgumentParser(description="Write the protocol's golden vectors.")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if a committed vector or the manifest differs, write nothing",
    )
    args = parser.parse_args(argv)
    expected = generated_files()
    # The files this script owns: the three folders' vectors and any JSON file at the top (a
    # stale manifest of another name, say); anything else there is left alone.
    present = {
        path.relative_to(VECTOR_DIR).as_posix()
        for folder, suffixes in (
            (REPORT_DIR, (".json", ".bin")),
            (ENVELOPE_DIR, (".json", ".bin")),
            (CANCEL_DIR, (".json", ".bin")),
            (VECTOR_DIR, (".json",)),
        )
        if folder.is_dir()
        for path in folder.iterdir()
        if path.is_file() and path.suffix in suffixes
    }
    stale = sorted(
        name
        for name, content in expected.items()
        if not (VECTOR_DIR / name).exists() or (VECTOR_DIR / name).read_bytes() != content
    )
    extra = sorted(present - expected.keys())
    shown = VECTOR_DIR.relative_to(ROOT).as_posix()
    if args.check:
        if stale or extra:
            for name in stale:
                print(f"out of date: {shown}/{name}", file=sys.stderr)
            for name in extra:
                print(f"not generated: {shown}/{name}", file=sys.stderr)
            return 1
        return 0
    for name in stale:
        path = VECTOR_DIR / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(expected[name])
        print(f"wrote {shown}/{name}")
    for name in extra:
        (VECTOR_DIR / name).unlink()
        print(f"removed {shown}/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
