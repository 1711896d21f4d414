"""The protocol's golden vectors, shipped in the package: where they are, their manifest, a copy.

The data folder next to this module (docs/conformance.md, "The golden vectors")::

    vectors/manifest.json
    vectors/reports/NNN-name.json    vectors/reports/NNN-name.bin
    vectors/envelopes/NNN-name.json  vectors/envelopes/NNN-name.bin
    vectors/cancels/NNN-name.json    vectors/cancels/NNN-name.bin

``scripts/generate_vectors.py`` writes all of it from one case table; docs/protocol.md, "Golden
vectors", says what each ``.json`` holds. ``manifest.json`` is a JSON object (sorted keys)::

    {"format_version": 1,
     "how_to_use": "...",
     "sections": ["Canonical encoding", ...],       # the docs/protocol.md titles a rule may name
     "vectors": [{"kind": "envelope" | "report" | "cancel",
                  "id": "NNN-name",
                  "json": "envelopes/NNN-name.json",  # paths relative to manifest.json
                  "bin": "envelopes/NNN-name.bin",
                  "description": "what the vector is",
                  "rule": {"section": "Decoding and poison messages", "text": "check 3: ..."},
                  "expect": "poison invalid_json, no task id"}, ...]}

:func:`load_manifest` reads it into :class:`Manifest`; :func:`export_vectors` copies the tree
out, with the protocol's JSON Schemas beside it (``schemas/``), for a suite of another language.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Final, Literal

from pydantic import TypeAdapter

from async_task_api_worker.protocol.schemas import SCHEMA_NAMES, schema_bytes, schema_file_name

__all__ = [
    "FOLDERS",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "SCHEMAS_FOLDER",
    "Manifest",
    "Rule",
    "VectorEntry",
    "export_vectors",
    "load_manifest",
    "vector_root",
]

#: The manifest's ``format_version`` this module reads (and the generator writes).
FORMAT_VERSION: Final = 1
#: The manifest's file name, at the top of the vector tree.
MANIFEST_NAME: Final = "manifest.json"
#: Each kind's folder in the tree.
FOLDERS: Final = {"envelope": "envelopes", "report": "reports", "cancel": "cancels"}
#: The folder of an export (:func:`export_vectors`) that holds the protocol's JSON Schemas.
SCHEMAS_FOLDER: Final = "schemas"
#: A vector's id: its number and its name, which are also its files' stem.
_ID: Final = re.compile(r"[0-9]{3}-[a-z0-9]+(?:-[a-z0-9]+)*")


@dataclass(frozen=True)
class Rule:
    """What a vector pins: a docs/protocol.md section title and the rule, in a phrase."""

    section: str
    text: str


@dataclass(frozen=True)
class VectorEntry:
    """One vector of the manifest; ``json`` and ``bin`` are relative to the manifest."""

    kind: Literal["envelope", "report", "cancel"]
    id: str
    json: str
    bin: str
    description: str
    rule: Rule
    expect: str


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``: its format, how to use the vectors, the sections, every vector."""

    format_version: int
    how_to_use: str
    sections: tuple[str, ...]
    vectors: tuple[VectorEntry, ...]


_MANIFEST_ADAPTER: Final = TypeAdapter(Manifest)


def _tree() -> Traversable:
    """The vector tree as importlib.resources sees it (a folder, or inside a zipped package)."""
    return resources.files("async_task_api_worker.conformance").joinpath("vectors")


def vector_root() -> Path:
    """The folder holding ``manifest.json``, ``reports/``, ``envelopes/`` and ``cancels/``.

    Raises:
        RuntimeError: the package is not on the file system (imported from a zip file): use
            :func:`export_vectors`, which works from anywhere.
    """
    tree = _tree()
    if not isinstance(tree, Path):
        raise RuntimeError(
            "the golden vectors are not on the file system (a zipped package); "
            "copy them with export_vectors(dest)"
        )
    return tree


def load_manifest() -> Manifest:
    """Read and check the shipped ``manifest.json``.

    Raises:
        ValueError: the manifest does not have the shape above (a pydantic ``ValidationError``),
            is of another ``format_version``, or has an id that is not ``NNN-name`` or a file
            other than ``<kind's folder>/<id>.json`` and ``.bin``.
    """
    manifest = _MANIFEST_ADAPTER.validate_json(_tree().joinpath(MANIFEST_NAME).read_bytes())
    if manifest.format_version != FORMAT_VERSION:
        raise ValueError(
            f"vector manifest format_version {manifest.format_version}; "
            f"this package reads {FORMAT_VERSION}"
        )
    for entry in manifest.vectors:
        # export_vectors joins these paths to its destination: only NNN-name files in the
        # kind's own folder, never "..", a separator or an absolute path.
        stem = f"{FOLDERS[entry.kind]}/{entry.id}"
        files = (f"{stem}.json", f"{stem}.bin")
        if not _ID.fullmatch(entry.id) or (entry.json, entry.bin) != files:
            raise ValueError(f"vector {entry.id!r}: files {entry.json!r}, {entry.bin!r}")
    return manifest


def export_vectors(dest: Path, *, force: bool = False) -> int:
    """Copy ``manifest.json``, every vector it names and the JSON Schemas into ``dest``.

    Byte for byte: the vectors as shipped here, the schemas as ``protocol/schemas`` ships them,
    under ``dest/schemas/`` (:data:`SCHEMAS_FOLDER`: ``envelope.schema.json``,
    ``report.schema.json``, ``cancel.schema.json``), so that a suite of another language can
    check the manifest's ``schema_valid`` verdicts without this package.

    ``dest`` is created (parents too) if missing. Nothing is ever deleted: with ``force``, files
    of the same names in a non-empty ``dest`` are overwritten and other files are left alone.

    Returns:
        The number of vectors copied (manifest entries; two files each).

    Raises:
        FileExistsError: ``dest`` exists and is not empty, and ``force`` is false.
        NotADirectoryError: ``dest`` exists and is not a folder.
        ValueError: the shipped manifest is broken (see :func:`load_manifest`).
        OSError: a file could not be written.
    """
    if dest.exists() and not dest.is_dir():
        raise NotADirectoryError(f"{dest} is not a directory")
    if not force and dest.is_dir() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty")
    manifest = load_manifest()
    tree = _tree()
    names = [
        MANIFEST_NAME,
        *(name for entry in manifest.vectors for name in (entry.json, entry.bin)),
    ]
    for name in names:
        _write(dest / name, tree.joinpath(*name.split("/")).read_bytes())
    for schema in SCHEMA_NAMES:
        _write(dest / SCHEMAS_FOLDER / schema_file_name(schema), schema_bytes(schema))
    return len(manifest.vectors)


def _write(target: Path, content: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content)
