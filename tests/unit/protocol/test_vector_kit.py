"""The golden vectors as a kit: the manifest, the accessor, the export (conformance.golden)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest

from async_task_api_worker.conformance import golden
from async_task_api_worker.conformance.golden import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    SCHEMAS_FOLDER,
    export_vectors,
    load_manifest,
    vector_root,
)
from async_task_api_worker.protocol.schemas import SCHEMA_NAMES, load_schema

ROOT = vector_root()
MANIFEST = load_manifest()


def _files_on_disk() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in ROOT.rglob("*")
        if path.is_file() and path.name != MANIFEST_NAME
    }


def _files_named() -> set[str]:
    return {name for entry in MANIFEST.vectors for name in (entry.json, entry.bin)}


#: The JSON Schemas as an export holds them, each with the shipped file's bytes.
SCHEMA_FILES = {
    f"{SCHEMAS_FOLDER}/{name}.schema.json": (
        resources.files("async_task_api_worker.protocol.schemas")
        .joinpath(f"{name}.schema.json")
        .read_bytes()
    )
    for name in SCHEMA_NAMES
}


# ------------------------------------------------------------------------------- the manifest


def test_every_vector_file_is_in_the_manifest() -> None:
    unlisted = _files_on_disk() - _files_named()
    assert unlisted == set(), "vector files the manifest does not list"


def test_every_file_the_manifest_names_exists() -> None:
    missing = {name for name in _files_named() if not (ROOT / name).is_file()}
    assert missing == set(), "manifest entries without their file"


def test_the_tree_holds_the_manifest_and_the_three_folders_only() -> None:
    assert {path.name for path in ROOT.iterdir()} == {
        MANIFEST_NAME,
        "envelopes",
        "reports",
        "cancels",
    }
    assert set(golden.FOLDERS.values()) == {"envelopes", "reports", "cancels"}


def test_every_kind_has_vectors() -> None:
    assert {entry.kind for entry in MANIFEST.vectors} == set(golden.FOLDERS)


def test_the_manifest_has_its_format_and_how_to_use() -> None:
    assert MANIFEST.format_version == FORMAT_VERSION
    assert "docs/conformance.md" in MANIFEST.how_to_use
    assert len(MANIFEST.vectors) == len(_files_on_disk()) // 2


def test_every_entry_has_a_unique_id_and_the_description_of_its_json() -> None:
    ids = [(entry.kind, entry.id) for entry in MANIFEST.vectors]
    assert len(set(ids)) == len(ids)
    for entry in MANIFEST.vectors:
        vector = json.loads((ROOT / entry.json).read_text(encoding="utf-8"))
        assert entry.description == vector["description"], entry.id


def test_every_rule_names_one_of_the_manifest_sections_and_says_something() -> None:
    sections = MANIFEST.sections
    assert sections, "no sections"
    assert len(set(sections)) == len(sections)
    assert all(section.strip() for section in sections)
    for entry in MANIFEST.vectors:
        assert entry.rule.section in sections, entry.id
        assert entry.rule.text.strip(), entry.id
        assert entry.expect.strip(), entry.id
    # Each listed section is pinned by a vector: the list cannot rot.
    assert {entry.rule.section for entry in MANIFEST.vectors} == set(sections)


def _schema_phrase(vector: dict[str, object]) -> str:
    if vector["schema_valid"] is None:
        return "; schema: not JSON"
    words = {True: "valid", False: "invalid"}
    return (
        f"; schema: {words[bool(vector['schema_valid'])]}, "
        f"with formats: {words[bool(vector['schema_valid_formats'])]}"
    )


def test_every_expectation_agrees_with_its_json() -> None:
    for entry in MANIFEST.vectors:
        vector = json.loads((ROOT / entry.json).read_text(encoding="utf-8"))
        if entry.kind == "report":
            assert entry.expect == f"{vector['report']['type']} report bytes", entry.id
            continue
        # An envelope's or a cancel's expectation ends with the schema's two verdicts.
        expect, phrase = entry.expect, _schema_phrase(vector)
        assert expect.endswith(phrase), entry.id
        expect = expect.removesuffix(phrase)
        if entry.kind == "cancel":
            if "refused" in vector:
                assert expect == f"refused {vector['refused']}", entry.id
            elif vector["canonical"]:
                assert expect.startswith("encodes to the .bin and decodes"), entry.id
            else:
                assert expect == "decodes to the recorded cancel", entry.id
        elif "poison" in vector:
            assert expect.startswith(f"poison {vector['poison']}, "), entry.id
            assert ("no task id" in expect) is (vector["task_id"] is None), entry.id
        else:
            assert expect == "decodes to the recorded envelope", entry.id


def test_the_manifest_json_is_stable() -> None:
    text = (ROOT / MANIFEST_NAME).read_text(encoding="utf-8")
    document = json.loads(text)
    assert text == json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# ------------------------------------------------------------------------------- the accessor


def from_zipped_package(tmp_path: Path, code: str, *, manifest: str | None = None) -> str:
    """Run ``code`` in a new interpreter importing the package from a zip file; its stdout.

    ``manifest`` replaces the shipped ``manifest.json`` in that copy of the package.
    """
    package = Path(golden.__file__).resolve().parents[1]
    archive = tmp_path / "package.zip"
    shipped = f"{package.name}/conformance/vectors/{MANIFEST_NAME}"
    with zipfile.ZipFile(archive, "w") as zipped:
        for path in package.rglob("*"):
            name = path.relative_to(package.parent).as_posix()
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if name == shipped and manifest is not None:
                zipped.writestr(name, manifest)
            else:
                zipped.write(path, name)
    script = (
        f"import sys\nsys.path.insert(0, {str(archive)!r})\n"
        "from async_task_api_worker.conformance import golden\n"
        f"assert golden.__file__.startswith({str(archive)!r}), golden.__file__\n{code}"
    )
    # Coverage measures the package, not this copy of it: the new interpreter goes unmeasured.
    environment = {k: v for k, v in os.environ.items() if not k.startswith("COV")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=environment,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def refusal_of(tmp_path: Path, manifest: str) -> str:
    """What ``load_manifest`` raises for ``manifest`` shipped in the package (a ValueError)."""
    return from_zipped_package(
        tmp_path,
        "try:\n    golden.load_manifest()\nexcept ValueError as exc:\n    print(exc)",
        manifest=manifest,
    )


def _manifest_document() -> dict[str, object]:
    document: dict[str, object] = json.loads((ROOT / MANIFEST_NAME).read_bytes())
    return document


def test_load_manifest_refuses_another_format_version(tmp_path: Path) -> None:
    document = _manifest_document()
    document["format_version"] = FORMAT_VERSION + 1
    assert "format_version 2" in refusal_of(tmp_path, json.dumps(document))


@pytest.mark.parametrize(
    "change",
    [
        {"json": "../../etc/passwd.json"},
        {"bin": "reports/001-minimal.bin"},
        {"kind": "report"},
        {"id": "../001-minimal", "json": "envelopes/../001-minimal.json"},
        {"id": "001-Minimal", "json": "envelopes/001-Minimal.json"},
    ],
    ids=[
        "json-outside",
        "bin-in-other-kind",
        "kind-of-other-files",
        "id-with-dots",
        "id-upper-case",
    ],
)
def test_load_manifest_refuses_a_bad_id_or_file(tmp_path: Path, change: dict[str, str]) -> None:
    document = _manifest_document()
    vectors = document["vectors"]
    assert isinstance(vectors, list)
    vectors[0].update(change)
    refused = refusal_of(tmp_path, json.dumps(document))
    assert refused.startswith("vector ") and "001-" in refused


def test_load_manifest_refuses_a_manifest_of_another_shape(tmp_path: Path) -> None:
    refused = refusal_of(tmp_path, '{"format_version": 1, "vectors": [{"kind": "x"}]}')
    assert "how_to_use" in refused


def test_vector_root_needs_the_package_on_the_file_system(tmp_path: Path) -> None:
    code = "try:\n    golden.vector_root()\nexcept RuntimeError as exc:\n    print(exc)"
    assert "export_vectors" in from_zipped_package(tmp_path, code)


def test_a_zipped_package_reads_and_exports_its_vectors(tmp_path: Path) -> None:
    code = (
        f"from pathlib import Path\nprint(golden.export_vectors(Path({str(tmp_path / 'out')!r})))"
    )
    assert from_zipped_package(tmp_path, code).strip() == str(len(MANIFEST.vectors))
    assert (tmp_path / "out" / MANIFEST_NAME).read_bytes() == (ROOT / MANIFEST_NAME).read_bytes()


# ------------------------------------------------------------------------------- the export


def test_export_vectors_round_trips_byte_for_byte(tmp_path: Path) -> None:
    dest = tmp_path / "deep" / "vectors"
    count = export_vectors(dest)
    exported = {
        path.relative_to(dest).as_posix(): path.read_bytes()
        for path in dest.rglob("*")
        if path.is_file()
    }
    assert count == len(MANIFEST.vectors)
    assert exported.keys() == _files_named() | {MANIFEST_NAME} | SCHEMA_FILES.keys()
    for name, content in exported.items():
        expected = SCHEMA_FILES.get(name) or (ROOT / name).read_bytes()
        assert content == expected, name


def test_the_export_holds_the_json_schemas_the_package_loads(tmp_path: Path) -> None:
    export_vectors(tmp_path)
    for name in SCHEMA_NAMES:
        exported = tmp_path / SCHEMAS_FOLDER / f"{name}.schema.json"
        assert json.loads(exported.read_bytes()) == load_schema(name)


def test_export_vectors_writes_into_an_empty_folder(tmp_path: Path) -> None:
    assert export_vectors(tmp_path) == len(MANIFEST.vectors)


def test_export_vectors_refuses_a_non_empty_folder_unless_forced(tmp_path: Path) -> None:
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    stale = tmp_path / MANIFEST.vectors[0].bin
    stale.parent.mkdir()
    stale.write_bytes(b"stale")
    with pytest.raises(FileExistsError, match="not empty"):
        export_vectors(tmp_path)
    assert stale.read_bytes() == b"stale"
    assert export_vectors(tmp_path, force=True) == len(MANIFEST.vectors)
    assert stale.read_bytes() == (ROOT / MANIFEST.vectors[0].bin).read_bytes()
    assert mine.read_text() == "mine", "force deletes nothing"


def test_force_overwrites_a_stale_schema_and_keeps_other_files_beside_it(tmp_path: Path) -> None:
    folder = tmp_path / SCHEMAS_FOLDER
    folder.mkdir()
    (folder / "report.schema.json").write_bytes(b"stale")
    (folder / "mine.schema.json").write_bytes(b"mine")
    with pytest.raises(FileExistsError, match="not empty"):
        export_vectors(tmp_path)
    export_vectors(tmp_path, force=True)
    assert (folder / "report.schema.json").read_bytes() == SCHEMA_FILES[
        f"{SCHEMAS_FOLDER}/report.schema.json"
    ]
    assert (folder / "mine.schema.json").read_bytes() == b"mine"


def test_export_vectors_refuses_a_file(tmp_path: Path) -> None:
    target = tmp_path / "vectors"
    target.write_text("")
    with pytest.raises(NotADirectoryError):
        export_vectors(target, force=True)


def test_the_accessor_api_is_pinned() -> None:
    assert sorted(golden.__all__) == [
        "FOLDERS",
        "FORMAT_VERSION",
        "MANIFEST_NAME",
        "Manifest",
        "Rule",
        "SCHEMAS_FOLDER",
        "VectorEntry",
        "export_vectors",
        "load_manifest",
        "vector_root",
    ]
