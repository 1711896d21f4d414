"""The shipped JSON Schemas (docs/protocol.md, "JSON Schemas")."""

from __future__ import annotations

import importlib.util
import json
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from jsonschema_specifications import REGISTRY as SPECIFICATIONS

from async_task_api_worker.protocol import ReportType
from async_task_api_worker.protocol.schemas import SCHEMA_NAMES, load_schema

ROOT = Path(__file__).resolve().parents[3]


def _generator() -> ModuleType:
    path = ROOT / "scripts" / "generate_schemas.py"
    spec = importlib.util.spec_from_file_location("_generate_schemas_under_test", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    files: dict[str, str] = _generator().generated_files()
    return files


def test_the_committed_schema_files_are_the_generated_ones(generated: dict[str, str]) -> None:
    package = resources.files("async_task_api_worker.protocol.schemas")
    assert set(generated) == {f"{name}.schema.json" for name in SCHEMA_NAMES}
    for name, text in generated.items():
        assert package.joinpath(name).read_text(encoding="utf-8") == text, (
            f"{name} is stale: run `uv run python scripts/generate_schemas.py`"
        )


def test_the_files_are_sorted_indented_and_end_with_a_newline(generated: dict[str, str]) -> None:
    for text in generated.values():
        assert text.endswith("}\n")
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_load_schema_gives_a_valid_draft_2020_12_schema(name: str) -> None:
    schema = load_schema(name)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"urn:asynctaskapi:protocol:1:{name}"
    assert "protocol version 1" in schema["title"]
    Draft202012Validator.check_schema(schema)


def test_load_schema_returns_a_fresh_copy() -> None:
    load_schema("report")["title"] = "changed"
    assert load_schema("report")["title"] != "changed"


@pytest.mark.parametrize("name", ["", "Envelope", "envelope.schema.json", "../envelope", "nope"])
def test_load_schema_refuses_an_unknown_name(name: str) -> None:
    with pytest.raises(ValueError, match="unknown schema"):
        load_schema(name)


def test_the_report_schema_is_a_union_of_the_four_reports_keyed_by_type() -> None:
    schema = load_schema("report")
    refs = [branch["$ref"] for branch in schema["oneOf"]]
    assert refs == [f"#/$defs/{kind.title()}Report" for kind in ReportType]
    # No OpenAPI discriminator (ajv's strict mode refuses it): the required const decides.
    assert "discriminator" not in schema
    for kind in ReportType:
        definition = schema["$defs"][f"{kind.title()}Report"]
        assert definition["properties"]["type"]["const"] == kind.value
        assert definition["additionalProperties"] is False
        # Every field is always on the wire, so every field is required.
        assert sorted(definition["required"]) == sorted(definition["properties"])


#: Every keyword of JSON Schema 2020-12: its vocabularies' meta-schemas' properties.
_KEYWORDS_2020_12 = frozenset(
    keyword
    for vocabulary in (
        "core", "applicator", "unevaluated", "validation", "meta-data", "format-annotation",
        "content",
    )
    for keyword in SPECIFICATIONS.contents(
        f"https://json-schema.org/draft/2020-12/meta/{vocabulary}"
    )["properties"]
)  # fmt: skip
#: Keywords whose value is a map of schemas, a list of schemas, or one schema.
_SCHEMA_MAPS = ("$defs", "properties", "patternProperties", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONES = ("additionalProperties", "items", "not", "if", "then", "else", "contains")


def _keywords(schema: Any) -> set[str]:
    """Every keyword used in ``schema`` and its subschemas (never inside a value)."""
    if not isinstance(schema, dict):
        return set()
    found = set(schema)
    for key, value in schema.items():
        if key in _SCHEMA_MAPS:
            found.update(*(_keywords(item) for item in value.values()))
        elif key in _SCHEMA_LISTS:
            found.update(*(_keywords(item) for item in value))
        elif key in _SCHEMA_ONES:
            found.update(_keywords(value))
    return found


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_the_schemas_use_json_schema_keywords_only(name: str) -> None:
    # What ajv's default strict mode asks (tests/js runs ajv itself): no unknown keyword, such
    # as OpenAPI's discriminator.
    assert _keywords(load_schema(name)) <= _KEYWORDS_2020_12


def test_the_envelope_schema_requires_five_fields_and_allows_unknown_ones() -> None:
    schema = load_schema("envelope")
    assert schema["required"] == ["protocol_version", "task_id", "client_id", "service", "input"]
    assert "additionalProperties" not in schema
    validator = Draft202012Validator(schema)
    minimal: dict[str, Any] = {
        "protocol_version": 1,
        "task_id": "t-1",
        "client_id": "c-1",
        "service": "svc",
        "input": {},
    }
    assert validator.is_valid(minimal)
    assert validator.is_valid({**minimal, "future": True})
    assert not validator.is_valid({**minimal, "protocol_version": 2})
    assert not validator.is_valid({**minimal, "task_id": "with space"})
    assert not validator.is_valid({key: minimal[key] for key in list(minimal)[:-1]})


def test_the_cancel_schema_requires_five_fields_and_allows_unknown_ones() -> None:
    schema = load_schema("cancel")
    assert schema["required"] == ["protocol_version", "type", "task_id", "client_id", "timestamp"]
    assert "additionalProperties" not in schema
    assert schema["properties"]["type"]["const"] == "cancel"
    validator = Draft202012Validator(schema)
    minimal: dict[str, Any] = {
        "protocol_version": 1,
        "type": "cancel",
        "task_id": "t-1",
        "client_id": "c-1",
        "timestamp": "2026-11-29T22:48:46.123456Z",
    }
    assert validator.is_valid(minimal)
    assert validator.is_valid({**minimal, "reason": "the user asked"})
    assert not validator.is_valid({**minimal, "protocol_version": 2})
    assert not validator.is_valid({**minimal, "type": "started"})
    assert not validator.is_valid({**minimal, "task_id": "with space"})
    assert not validator.is_valid({**minimal, "timestamp": "2026-11-29T22:48:46Z"})
    assert not validator.is_valid({key: minimal[key] for key in list(minimal)[:-1]})
