"""The AsyncAPI document in the AsyncAPI initiative's tools, as a TypeScript team uses them.

docs/protocol.md, "The contract as AsyncAPI 3.1", says what is checked and why.

For the documents of the two example workers and of ``codegen_worker`` (task models named
``Envelope`` and ``Output``, a tuple, a discriminated union, an integer literal):
``@asyncapi/parser`` reports nothing about them, no error, warning or advice; Modelina
generates TypeScript models from the file, each under a name of its own; ``tsc`` compiles
them, strict. Every report golden vector goes through the models of
the conformance worker (``unmarshal`` then ``marshal``, in ``roundtrip.ts``) and comes back
as the same JSON value, ``protocol_version`` included. Numbers are compared as the doubles
JavaScript holds (``1.0`` and ``1``, and ``-0.0`` and ``0``, are one; an integer past 2^53 is
its nearest double), and ``service`` is the worker's name, which the document fixes.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from async_task_api_worker.asyncapi import asyncapi_document
from async_task_api_worker.conformance.golden import load_manifest, vector_root
from async_task_api_worker.settings import load_settings
from examples.conformance_worker import worker as conformance
from examples.count_words import worker as count_words
from tests.js.codegen_worker import worker as codegen
from tests.js.tools import HERE, node, tsc

WORKERS = {"count_words": count_words, "conformance": conformance, "codegen": codegen}
#: The models every document has: the protocol's schemas under their own names, the enum of
#: ``protocol_version``, and the union of the output channel's four reports.
PROTOCOL_MODELS = {
    "Envelope", "InputRef", "StartedReport", "ProgressReport", "SuccessReport", "FailureReport",
    "ReportError", "CancelRequest", "ProtocolVersion", "Output",
}  # fmt: skip
#: The models of the task's schemas (``task.<Model>``, titled ``Task<Model>``).
TASK_MODELS = {
    "count_words": {"TaskInput", "TaskOutput"},
    "conformance": {"TaskInput"},  # its Output, any object, is a map, not a model
    "codegen": {"TaskEnvelope", "TaskOutput", "TaskItem", "TaskCat", "TaskDog"},
}


@dataclass(frozen=True)
class Generated:
    """The documents through the tools: what they said of each, and tsc's output on all."""

    folder: Path
    said: dict[str, dict[str, Any]]
    tsc_status: int
    tsc_output: str


@pytest.fixture(scope="module")
def generated(js_tools: Path, tmp_path_factory: pytest.TempPathFactory) -> Generated:
    """Each worker's document parsed and its models generated (one node run), then compiled
    with the round-trip program, strict (one tsc run): ``<folder>/<worker>/models/``.
    """
    folder = tmp_path_factory.mktemp("asyncapi")
    requests = []
    for name, worker in WORKERS.items():
        (folder / name).mkdir()
        document = asyncapi_document(worker, load_settings({}, read_environment=False))
        (folder / name / "document.json").write_text(json.dumps(document), encoding="utf-8")
        requests.append(
            {
                "document": str(folder / name / "document.json"),
                "out": str(folder / name / "models"),
                "from_object": name == "count_words",
            }
        )
    said = node(js_tools, HERE / "asyncapi_models.js", stdin=json.dumps(requests))
    shutil.copyfile(HERE / "roundtrip.ts", folder / "conformance" / "roundtrip.ts")
    options = {
        "strict": True, "target": "ES2022", "module": "commonjs", "types": [],
        "rootDir": ".", "outDir": "build", "noEmitOnError": True,
    }  # fmt: skip
    config = {"compilerOptions": options, "include": ["*/models/*.ts", "*/roundtrip.ts"]}
    (folder / "tsconfig.json").write_text(json.dumps(config), encoding="utf-8")
    built = tsc(js_tools, folder)
    return Generated(
        folder, dict(zip(WORKERS, said, strict=True)), built.returncode, built.stdout + built.stderr
    )


@pytest.mark.parametrize("name", list(WORKERS))
def test_the_parser_has_nothing_to_say_about_the_document(generated: Generated, name: str) -> None:
    # Not even its advice to move to the latest AsyncAPI version (asyncapi-latest-version).
    assert generated.said[name]["diagnostics"] == []


@pytest.mark.parametrize("name", list(WORKERS))
def test_modelina_gives_every_model_a_name_of_its_own(generated: Generated, name: str) -> None:
    models = generated.said[name]["models"]
    assert len(models) == len(set(models))
    # Modelina warns of a model overwritten by another of its name (some overwrite silently).
    assert not [said for said in generated.said[name]["warnings"] if "Overwriting" in said]
    assert set(models) >= PROTOCOL_MODELS | TASK_MODELS[name]


def test_modelina_given_the_document_itself_makes_nothing_of_asyncapi_3_1(
    generated: Generated,
) -> None:
    # Why the models come from the file (docs/protocol.md says so): Modelina 5.10 checks the
    # version of a document given as an object against a list that ends at 3.0.0. When a pin
    # bump fixes it, this fails: drop the advice from the docs.
    said = generated.said["count_words"]
    assert said["models_from_object"] == ["Root"]
    assert said["object_warnings"] == [
        "Failed to convert root to MetaModel, defaulting to AnyModel"
    ]


def test_tsc_compiles_every_documents_models_strict(generated: Generated) -> None:
    assert (generated.tsc_status, generated.tsc_output) == (0, "")


def _as_doubles(value: Any) -> Any:
    """A JSON value with its numbers as doubles, all that JavaScript keeps of them."""
    if isinstance(value, dict):
        return {key: _as_doubles(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_doubles(item) for item in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return value


def test_every_report_vector_round_trips_through_the_models(generated: Generated) -> None:
    root = vector_root()
    reports = {
        str(root / entry.bin): json.loads((root / entry.json).read_text(encoding="utf-8"))
        for entry in load_manifest().vectors
        if entry.kind == "report"
    }
    paths = generated.folder / "paths.json"
    paths.write_text(json.dumps(list(reports)), encoding="utf-8")
    said = node(Path(), generated.folder / "build" / "conformance" / "roundtrip.js", str(paths))
    assert said["unmarshalled"].keys() == reports.keys()
    for path, vector in reports.items():
        marshalled = json.loads(said["unmarshalled"][path])
        expected = {**vector["report"], "service": conformance.name}
        assert type(marshalled["protocol_version"]) is int, path
        assert _as_doubles(marshalled) == _as_doubles(expected), path
    started = next(vector for vector in reports.values() if vector["report"]["type"] == "started")
    assert json.loads(said["constructed"]) == {**started["report"], "service": conformance.name}
