"""The golden vectors, the conformance kit's package data (docs/protocol.md, "Golden vectors").

The vectors are committed files: these tests read them (through ``conformance.golden``, as any
installed copy would be read) and never regenerate them, so a change in the encoder or the
decoder that alters a single byte fails here. Their manifest: test_vector_kit.py.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import TypeAdapter

from async_task_api_worker.conformance.golden import vector_root
from async_task_api_worker.errors import CancelDecodeError, EnvelopeDecodeError
from async_task_api_worker.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    CancelDecodeReason,
    ErrorCode,
    PoisonReason,
    Report,
    ReportType,
    decode_cancel,
    decode_envelope,
    decode_report,
    encode_cancel,
    encode_report,
)
from async_task_api_worker.protocol.encoding import strict_loads
from async_task_api_worker.protocol.schemas import load_schema

VECTORS = vector_root()
PROTOCOL_DOC = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"
REPORTS = sorted((VECTORS / "reports").glob("*.json"))
ENVELOPES = sorted((VECTORS / "envelopes").glob("*.json"))
CANCELS = sorted((VECTORS / "cancels").glob("*.json"))
#: The cancel vectors that decode, whose fields can be encoded again.
DECODED_CANCELS = [
    path for path in CANCELS if "cancel" in json.loads(path.read_text(encoding="utf-8"))
]

REPORT_ADAPTER: TypeAdapter[Any] = TypeAdapter(Report)
REPORT_VALIDATOR = Draft202012Validator(load_schema("report"))
ENVELOPE_VALIDATOR = Draft202012Validator(load_schema("envelope"))
CANCEL_VALIDATOR = Draft202012Validator(load_schema("cancel"))
#: The same, formats enforced: jsonschema's date-time is RFC 3339's (rfc3339-validator).
FORMATS = Draft202012Validator.FORMAT_CHECKER
ENVELOPE_FORMATS_VALIDATOR = Draft202012Validator(load_schema("envelope"), format_checker=FORMATS)
CANCEL_FORMATS_VALIDATOR = Draft202012Validator(load_schema("cancel"), format_checker=FORMATS)


def _load(path: Path) -> tuple[dict[str, Any], bytes]:
    return json.loads(path.read_text(encoding="utf-8")), path.with_suffix(".bin").read_bytes()


def _ids(paths: list[Path]) -> list[str]:
    return [path.stem for path in paths]


# ------------------------------------------------------------------------------- inventory


def test_there_are_at_least_25_vectors() -> None:
    assert len(REPORTS) + len(ENVELOPES) >= 25
    assert len(REPORTS) >= 10
    assert len(ENVELOPES) >= 10


@pytest.mark.parametrize("folder", ["reports", "envelopes", "cancels"])
def test_every_vector_is_a_json_and_bin_pair_with_a_unique_number(folder: str) -> None:
    files = list((VECTORS / folder).iterdir())
    stems_json = {path.stem for path in files if path.suffix == ".json"}
    stems_bin = {path.stem for path in files if path.suffix == ".bin"}
    assert stems_json == stems_bin
    assert {path.suffix for path in files} == {".json", ".bin"}
    numbers = [stem.split("-", 1)[0] for stem in stems_json]
    assert all(len(number) == 3 and number.isdigit() for number in numbers)
    assert len(set(numbers)) == len(numbers)


def test_report_vectors_cover_every_report_type_and_error_code() -> None:
    reports = [_load(path)[0]["report"] for path in REPORTS]
    assert {report["type"] for report in reports} == {kind.value for kind in ReportType}
    codes = {report["error"]["code"] for report in reports if report["type"] == "failure"}
    assert {code.value for code in ErrorCode} <= codes
    assert codes - {code.value for code in ErrorCode}, "no vector with a user error code"


def test_envelope_vectors_cover_every_poison_reason_and_valid_bodies() -> None:
    expectations = [_load(path)[0] for path in ENVELOPES]
    assert {item["poison"] for item in expectations if "poison" in item} == {
        reason.value for reason in PoisonReason
    }
    assert sum("envelope" in item for item in expectations) >= 5


# ------------------------------------------------------------------------------- reports


@pytest.mark.parametrize("path", REPORTS, ids=_ids(REPORTS))
def test_report_vector_encodes_to_its_exact_bytes(path: Path) -> None:
    vector, expected = _load(path)
    report = REPORT_ADAPTER.validate_python(vector["report"])
    encoded = encode_report(report, seq=vector["seq"])
    assert encoded.body == expected


@pytest.mark.parametrize("path", REPORTS, ids=_ids(REPORTS))
def test_report_vector_decodes_back_to_an_equal_report(path: Path) -> None:
    vector, body = _load(path)
    decoded = decode_report(body)
    assert decoded == REPORT_ADAPTER.validate_python(vector["report"])
    assert decoded.model_dump(mode="python") == vector["report"]


@pytest.mark.parametrize("path", REPORTS, ids=_ids(REPORTS))
def test_report_vector_has_its_recorded_amqp_properties(path: Path) -> None:
    vector, _ = _load(path)
    properties = encode_report(
        REPORT_ADAPTER.validate_python(vector["report"]), seq=vector["seq"]
    ).properties
    assert properties.recorded() == vector["properties"]
    report = vector["report"]
    assert properties.message_id == f"{report['task_id']}/{report['attempt']}/{vector['seq']}"


@pytest.mark.parametrize("path", REPORTS, ids=_ids(REPORTS))
def test_report_vector_bytes_validate_against_the_report_schema(path: Path) -> None:
    _, body = _load(path)
    REPORT_VALIDATOR.validate(json.loads(body))


def test_report_schema_refuses_a_report_with_an_unknown_field() -> None:
    _, body = _load(REPORTS[0])
    document = json.loads(body)
    document["extra"] = 1
    assert not REPORT_VALIDATOR.is_valid(document)


def test_a_few_report_vectors_match_bytes_written_by_hand() -> None:
    # Independent of the generator: these were written out by hand from the rules.
    started = (VECTORS / "reports" / "001-started.bin").read_bytes()
    assert started == (
        b'{"attempt":1,"client_id":"client-a","protocol_version":1,"service":"resize",'
        b'"task_id":"t-0001","timestamp":"2026-11-29T22:48:46.123456Z","type":"started"}'
    )
    progress = (VECTORS / "reports" / "003-progress-no-payload.bin").read_bytes()
    assert b'"fraction":0.25,"payload":null,' in progress
    # A response holding a lone surrogate is refused, not escaped: the failure sent instead.
    surrogates = (VECTORS / "reports" / "014-failure-lone-surrogates-in-a-result.bin").read_bytes()
    assert (
        b'"error":{"code":"INVALID_RESULT","message":"the handler\'s result cannot be reported: '
        b'value is not valid Unicode: a lone surrogate U+D800 at high"}' in surrogates
    )
    assert b"\\u" not in surrogates
    message = (VECTORS / "reports" / "032-failure-message-lone-surrogate.bin").read_bytes()
    assert b'"message":"cannot read report-\\udcff.csv"' in message  # a message may hold one
    key_order = (VECTORS / "reports" / "017-success-key-order.bin").read_bytes()
    assert key_order.index("ｚ".encode()) < key_order.index("😀".encode())
    floats = (VECTORS / "reports" / "016-success-floats.bin").read_bytes()
    for text in (b'"small":1e-05', b'"big":1e+16', b'"minus_zero":-0.0', b'"one":1.0'):
        assert text in floats


# ------------------------------------------------------------------------------- envelopes


def _decode_as_worker(vector: dict[str, Any], body: bytes) -> dict[str, Any]:
    """Decode as a worker would: the body limit, then the worker's own service name."""
    try:
        envelope = decode_envelope(
            body, max_body_bytes=vector.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES)
        )
    except EnvelopeDecodeError as exc:
        return {"poison": exc.reason, "task_id": exc.task_id, "client_id": exc.client_id}
    service = vector.get("worker_service", envelope.service)
    if envelope.service != service:
        return {
            "poison": PoisonReason.WRONG_SERVICE.value,
            "task_id": envelope.task_id,
            "client_id": envelope.client_id,
        }
    return {"envelope": envelope.model_dump(mode="json")}


@pytest.mark.parametrize("path", ENVELOPES, ids=_ids(ENVELOPES))
def test_envelope_vector_decodes_as_recorded(path: Path) -> None:
    vector, body = _load(path)
    expected = {
        key: vector[key] for key in ("envelope", "poison", "task_id", "client_id") if key in vector
    }
    assert _decode_as_worker(vector, body) == expected


@pytest.mark.parametrize("path", ENVELOPES, ids=_ids(ENVELOPES))
def test_envelope_vector_has_its_recorded_schema_verdict(path: Path) -> None:
    vector, body = _load(path)
    try:
        document = strict_loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        assert vector["schema_valid"] is None
        assert vector["schema_valid_formats"] is None
        return
    assert ENVELOPE_VALIDATOR.is_valid(document) is vector["schema_valid"]
    assert ENVELOPE_FORMATS_VALIDATOR.is_valid(document) is vector["schema_valid_formats"]
    if "envelope" in vector:
        # What the decoder accepts, the schema accepts, formats enforced, and the decoded form.
        assert vector["schema_valid_formats"] is True
        ENVELOPE_FORMATS_VALIDATOR.validate(vector["envelope"])


def test_enforcing_formats_changes_a_verdict() -> None:
    # Without rfc3339-validator, jsonschema checks no date-time and the two verdicts are one.
    assert "date-time" in FORMATS.checkers
    changed = {
        path.stem.split("-", 1)[1]
        for path in ENVELOPES
        if (vector := _load(path)[0])["schema_valid"] != vector["schema_valid_formats"]
    }
    assert changed == {"created-at-no-offset"}


def test_the_report_examples_in_the_spec_are_vector_bytes() -> None:
    spec = PROTOCOL_DOC.read_text(encoding="utf-8")
    examples = [
        line.strip().encode() for line in spec.splitlines() if line.strip().startswith('{"attempt"')
    ]
    assert len(examples) == 4
    bodies = {path.with_suffix(".bin").read_bytes() for path in REPORTS}
    for example in examples:
        assert example in bodies


# ------------------------------------------------------------------------------- cancels


def test_cancel_vectors_cover_every_reason_and_valid_bodies() -> None:
    expectations = [_load(path)[0] for path in CANCELS]
    assert {item["refused"] for item in expectations if "refused" in item} == {
        reason.value for reason in CancelDecodeReason
    }
    assert sum("cancel" in item for item in expectations) >= 3
    assert sum(item.get("canonical", False) for item in expectations) >= 2
    assert any("cancel" in item and not item["canonical"] for item in expectations)


@pytest.mark.parametrize("path", CANCELS, ids=_ids(CANCELS))
def test_cancel_vector_decodes_as_recorded(path: Path) -> None:
    vector, body = _load(path)
    expected = {key: vector[key] for key in ("cancel", "refused") if key in vector}
    assert _decode_cancel(body) == expected


def _decode_cancel(body: bytes) -> dict[str, Any]:
    try:
        request = decode_cancel(body)
    except CancelDecodeError as exc:
        return {"refused": exc.reason}
    return {"cancel": request.model_dump(mode="json")}


@pytest.mark.parametrize("path", DECODED_CANCELS, ids=_ids(DECODED_CANCELS))
def test_decoded_cancel_vector_encodes_to_its_bytes_when_canonical(path: Path) -> None:
    vector, expected = _load(path)
    fields = vector["cancel"]
    body, properties = encode_cancel(
        fields["task_id"], fields["client_id"], datetime.fromisoformat(fields["timestamp"])
    )
    assert (body == expected) is vector["canonical"]
    if vector["canonical"]:
        assert properties.recorded() == vector["properties"]
    else:
        assert "properties" not in vector


@pytest.mark.parametrize("path", CANCELS, ids=_ids(CANCELS))
def test_cancel_vector_has_its_recorded_schema_verdict(path: Path) -> None:
    vector, body = _load(path)
    try:
        document = strict_loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        assert vector["schema_valid"] is None
        assert vector["schema_valid_formats"] is None
        return
    assert CANCEL_VALIDATOR.is_valid(document) is vector["schema_valid"]
    assert CANCEL_FORMATS_VALIDATOR.is_valid(document) is vector["schema_valid_formats"]
    if "cancel" in vector:
        assert vector["schema_valid_formats"] is True
        CANCEL_FORMATS_VALIDATOR.validate(vector["cancel"])


def test_the_cancel_example_in_the_spec_is_vector_bytes() -> None:
    spec = PROTOCOL_DOC.read_text(encoding="utf-8")
    examples = [
        line.strip().encode()
        for line in spec.splitlines()
        if line.strip().startswith('{"client_id"') and '"type":"cancel"' in line
    ]
    assert examples == [(VECTORS / "cancels" / "001-minimal.bin").read_bytes()]


def test_the_minimal_cancel_vector_matches_bytes_written_by_hand() -> None:
    # Independent of the generator: written out by hand from the rules.
    assert (VECTORS / "cancels" / "001-minimal.bin").read_bytes() == (
        b'{"client_id":"client-a","protocol_version":1,"task_id":"t-0001",'
        b'"timestamp":"2026-11-29T22:48:46.123456Z","type":"cancel"}'
    )
