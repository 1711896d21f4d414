"""``asyncapi`` prints valid AsyncAPI 3.1, by the AsyncAPI initiative's own JSON Schema.

The schema comes from npm (``tests/asyncapi_specs.py``): without npm or the registry the
validation skips, except under ``CI=true``, where it fails (as the integration tests do without
a broker).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from async_task_api_worker.asyncapi import asyncapi_document
from async_task_api_worker.cli import main
from async_task_api_worker.settings import load_settings
from tests import asyncapi_specs
from tests.asyncapi_specs import SpecsUnavailableError, asyncapi_3_schema, validator
from tests.unit.asyncapi.asyncapi_workers import rich

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def asyncapi_validator() -> jsonschema.Draft7Validator:
    """A validator of AsyncAPI 3.1.0 documents: skip without npm, fail under CI=true."""
    try:
        schema = asyncapi_3_schema()
    except SpecsUnavailableError as exc:
        message = f"the AsyncAPI 3.1 JSON Schema is not available: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (CI=true: the AsyncAPI validation must run)")
        pytest.skip(message)
    return validator(schema)


@pytest.fixture
def example_document(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """What ``asyncapi examples.count_words:worker`` prints, parsed."""
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("IN_QUEUE_NAME", raising=False)
    monkeypatch.delenv("OUT_QUEUE_NAME", raising=False)
    assert main(["asyncapi", "examples.count_words:worker"]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


def errors_of(checker: jsonschema.Draft7Validator, document: dict[str, Any]) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in checker.iter_errors(document)]


def test_the_example_document_is_valid_asyncapi_3_1(
    asyncapi_validator: jsonschema.Draft7Validator, example_document: dict[str, Any]
) -> None:
    assert errors_of(asyncapi_validator, example_document) == []
    schemas = example_document["components"]["schemas"]
    assert "text" in schemas["task.Input"]["properties"]
    assert "words" in schemas["task.Output"]["properties"]
    assert example_document["channels"]["control"]["bindings"]["amqp"]["is"] == "routingKey"
    assert "cancel" in example_document["components"]["messages"]
    assert "receiveCancels" in example_document["operations"]
    failure = example_document["components"]["messages"]["failure"]
    assert failure["x-error-codes"]["EMPTY_TEXT"] == {
        "reserved": False,
        "task": "the text holds nothing to count",
    }


def test_a_task_with_tuples_and_a_discriminated_union_is_valid_too(
    asyncapi_validator: jsonschema.Draft7Validator,
) -> None:
    # pydantic writes these in draft 2020-12 / OpenAPI forms that AsyncAPI's dialect refuses
    # (a discriminator object): the document rewrites them, or leaves them out.
    document = asyncapi_document(rich, load_settings({}, read_environment=False))
    assert errors_of(asyncapi_validator, document) == []
    pet = document["components"]["schemas"]["task.Envelope"]["properties"]["pet"]
    pet["discriminator"] = {"propertyName": "kind"}
    assert errors_of(asyncapi_validator, document) != []


def _without_version(document: dict[str, Any]) -> None:
    del document["asyncapi"]


def _exchange_binding_without_exchange(document: dict[str, Any]) -> None:
    document["channels"]["input"]["bindings"]["amqp"]["is"] = "routingKey"


def _a_control_exchange_of_an_unknown_type(document: dict[str, Any]) -> None:
    document["channels"]["control"]["bindings"]["amqp"]["exchange"]["type"] = "x-fanout"


def _a_cancel_property_amqp_has_no_field_for(document: dict[str, Any]) -> None:
    document["components"]["messages"]["cancel"]["bindings"]["amqp"]["deliveryMode"] = 1


def _a_schema_that_is_not_one(document: dict[str, Any]) -> None:
    document["components"]["schemas"]["task.Input"]["properties"]["text"]["type"] = 3


def _an_asyncapi_2_verb(document: dict[str, Any]) -> None:
    document["operations"]["sendReports"]["action"] = "publish"


@pytest.mark.parametrize(
    "breaking",
    [
        _without_version,
        _exchange_binding_without_exchange,
        _a_control_exchange_of_an_unknown_type,
        _a_cancel_property_amqp_has_no_field_for,
        _a_schema_that_is_not_one,
        _an_asyncapi_2_verb,
    ],
)
def test_the_validator_refuses_a_broken_document(
    asyncapi_validator: jsonschema.Draft7Validator,
    example_document: dict[str, Any],
    breaking: Callable[[dict[str, Any]], None],
) -> None:
    # Proof that the check above is real: the top level, a binding, a payload schema and an
    # operation are each looked at, references followed.
    broken = copy.deepcopy(example_document)
    breaking(broken)
    assert errors_of(asyncapi_validator, broken) != []


def test_a_cached_tarball_that_is_not_the_pinned_one_is_refused_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(asyncapi_specs, "CACHE", tmp_path)
    tampered = tmp_path / f"asyncapi-specs-{asyncapi_specs.VERSION}.tgz"
    tampered.write_bytes(b"not the package")
    with pytest.raises(AssertionError, match="integrity sha512-"):
        asyncapi_specs.tarball()
    assert not tampered.exists()


def test_without_npm_the_specs_are_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(asyncapi_specs, "CACHE", tmp_path)
    monkeypatch.setattr(asyncapi_specs.shutil, "which", lambda name: None)
    with pytest.raises(SpecsUnavailableError, match="npm is not installed"):
        asyncapi_specs.tarball()
