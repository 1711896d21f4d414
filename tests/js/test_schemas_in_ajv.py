"""The protocol's JSON Schemas in ajv 8, as they come (docs/protocol.md, "JSON Schemas").

ajv (``Ajv2020``) compiles each schema in its default strict mode with ajv-formats, and with
every strict option an error, with nothing logged; its verdict on every golden vector's body is
the one the vector records: ``schema_valid`` with formats not validated, ``schema_valid_formats``
with ajv-formats. The tools are pinned (``tests/js/package-lock.json``); without them the tests
skip, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from async_task_api_worker.conformance.golden import load_manifest, vector_root
from async_task_api_worker.protocol.schemas import SCHEMA_NAMES, load_schema
from tests.js.tools import HERE, node

#: date-time strings, and whether ajv-formats takes them. jsonschema's checker (RFC 3339, by
#: rfc3339-validator), which computes ``schema_valid_formats``, takes the first group only:
#: where they differ, ajv-formats is the laxer.
DATE_TIMES = {
    True: [
        "2026-11-29T22:48:46Z",
        "2026-11-29T22:48:46.123456789+00:00",
        "2026-11-29t22:48:46z",
        "2026-11-29T23:48:46+01:00",
        "2026-11-29T22:48:46-23:59",
        "2024-02-29T00:00:00Z",
    ],
    False: [
        "2026-11-29T22:48:46",  # no offset
        "2026-13-01T00:00:00Z",
        "2025-02-29T00:00:00Z",
        "2026-11-29T24:00:00Z",
        "2026-11-29T22:48:46+24:00",
        "2026-11-29T22:48Z",
        "2026-11-29",
        "\uff12\uff10\uff12\uff16-11-29T22:48:46Z",  # fullwidth digits
    ],
}
#: What ajv-formats takes and RFC 3339 does not.
AJV_ONLY = [
    "2026-11-29 22:48:46Z",  # a space (or any white space) for the T
    "2026-11-29\t22:48:46Z",
    "2026-11-29T22:48:46+0100",  # an offset without its colon, or its minutes
    "2026-11-29T22:48:46+01",
    "2026-12-31T23:59:60Z",  # a leap second
    "0000-01-01T00:00:00Z",  # the year 0
]


@pytest.fixture(scope="module")
def ajv(js_tools: Path) -> dict[str, Any]:
    """ajv's compile results, logs and verdicts on every vector (one node run)."""
    root = vector_root()
    bodies = []
    for entry in load_manifest().vectors:
        vector = json.loads((root / entry.json).read_text(encoding="utf-8"))
        if vector.get("schema_valid", True) is None:
            continue  # not JSON at all: no schema verdict to compare
        bodies.append({"id": entry.json, "schema": entry.kind, "path": str(root / entry.bin)})
    request = {
        "schemas": {name: load_schema(name) for name in SCHEMA_NAMES},
        "bodies": bodies,
        "date_times": [*DATE_TIMES[True], *DATE_TIMES[False], *AJV_ONLY],
    }
    result: dict[str, Any] = node(js_tools, HERE / "ajv_verdicts.js", stdin=json.dumps(request))
    return result


def test_ajv_compiles_every_schema_in_strict_mode_with_nothing_logged(ajv: dict[str, Any]) -> None:
    assert ajv["compile"] == {
        mode: dict.fromkeys(SCHEMA_NAMES) for mode in ("default", "strict", "plain")
    }
    assert ajv["logs"] == []


def test_ajvs_verdicts_are_the_vectors(ajv: dict[str, Any]) -> None:
    root = vector_root()
    found, expected = {}, {}
    for name, verdict in ajv["verdicts"].items():
        vector = json.loads((root / name).read_text(encoding="utf-8"))
        found[name] = (verdict["plain"], verdict["formats"])
        # A report vector is a valid report, formats or not.
        expected[name] = (
            vector.get("schema_valid", True),
            vector.get("schema_valid_formats", True),
        )
    assert found == expected
    kinds = {name.split("/")[0] for name in found}
    assert kinds == {"reports", "envelopes", "cancels"}
    assert (True, False) in found.values()  # a date-time the formats refuse


def test_ajv_formats_and_jsonschemas_date_time_agree_but_where_ajv_is_laxer(
    ajv: dict[str, Any],
) -> None:
    checker = Draft202012Validator.FORMAT_CHECKER
    for verdict, texts in DATE_TIMES.items():
        for text in texts:
            assert (ajv["date_times"][text], checker.conforms(text, "date-time")) == (
                verdict,
                verdict,
            ), text
    for text in AJV_ONLY:
        assert (ajv["date_times"][text], checker.conforms(text, "date-time")) == (True, False)
