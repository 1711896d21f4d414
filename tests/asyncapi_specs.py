"""The official JSON Schema of AsyncAPI 3.1, as the AsyncAPI initiative publishes it on npm.

``@asyncapi/specs`` is fetched once with ``npm pack`` into ``.cache/asyncapi-specs/`` (git-ignored)
and checked against the integrity npm's registry gives for the pinned version
(``npm view @asyncapi/specs@6.11.1 dist.integrity``) on every use, so a tarball that changed is
never trusted. The schema is read from the tarball itself, nothing is extracted.

The schema used is ``schemas/3.1.0-without-$id.json``: the same rules as ``3.1.0.json``, with
every reference local (``#/definitions/...``), JSON Schema draft-07's meta-schema included. It
validates with an empty ``referencing`` registry, so nothing is ever looked up on the network.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import referencing

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "asyncapi-specs"
PACKAGE = "@asyncapi/specs"
VERSION = "6.11.1"
#: ``npm view @asyncapi/specs@6.11.1 dist.integrity``.
INTEGRITY = (
    "sha512-A3WBLqAKGoJ2+6FWFtpjBlCQ1oFCcs4GxF7zsIGvNqp/"
    "klGUHjlA3aAcZ9XMMpLGE8zPeYDz2x9FmO6DSuKraQ=="
)
SCHEMA_MEMBER = "package/schemas/3.1.0-without-$id.json"
#: npm pack must finish within the suite's 60 s per test (the fixture's setup counts).
NPM_TIMEOUT_S = 45


class SpecsUnavailableError(Exception):
    """npm is missing, or could not fetch the package (no network, no registry)."""


def integrity_of(path: Path) -> str:
    """npm's ``dist.integrity`` form of a file: ``sha512-<base64 digest>``."""
    digest = hashlib.sha512(path.read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode("ascii")


def _pack(destination: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise SpecsUnavailableError("npm is not installed")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
        try:
            done = subprocess.run(
                [
                    npm, "pack", f"{PACKAGE}@{VERSION}", "--pack-destination", scratch,
                    "--json", "--fetch-retries=1", "--fetch-timeout=20000",
                ],
                capture_output=True, text=True, timeout=NPM_TIMEOUT_S, check=False, cwd=scratch,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise SpecsUnavailableError(f"npm pack {PACKAGE}@{VERSION} timed out") from exc
        packed = sorted(Path(scratch).glob("*.tgz"))
        if done.returncode != 0 or len(packed) != 1:
            # npm's first error line says why (its last one only points at a log file).
            said = next(
                (line for line in done.stderr.splitlines() if line.startswith("npm error")),
                done.stderr.strip() or f"exit code {done.returncode}",
            )
            raise SpecsUnavailableError(f"npm pack {PACKAGE}@{VERSION} failed: {said}")
        # Whole or absent: a run cut short never leaves half a tarball behind.
        os.replace(packed[0], destination)


def tarball() -> Path:
    """The pinned package's tarball, fetched on first use and checked every time.

    Raises:
        SpecsUnavailableError: it is not cached, and npm cannot fetch it.
        AssertionError: its integrity is not the pinned one (the file is removed).
    """
    path = CACHE / f"asyncapi-specs-{VERSION}.tgz"
    if not path.exists():
        _pack(path)
    found = integrity_of(path)
    if found != INTEGRITY:
        path.unlink()
        raise AssertionError(f"{PACKAGE}@{VERSION}: integrity {found}, expected {INTEGRITY}")
    return path


def asyncapi_3_schema() -> dict[str, Any]:
    """``schemas/3.1.0-without-$id.json`` of the pinned package."""
    with tarfile.open(tarball()) as archive:
        member = archive.extractfile(SCHEMA_MEMBER)
        assert member is not None, SCHEMA_MEMBER
        schema: dict[str, Any] = json.load(member)
    return schema


def validator(schema: dict[str, Any]) -> jsonschema.Draft7Validator:
    """A draft-07 validator of ``schema`` that resolves local references only."""
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(
        schema,
        registry=referencing.Registry(),
        format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER,
    )
