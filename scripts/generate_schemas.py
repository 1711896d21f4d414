"""Write the protocol's JSON Schema files from its pydantic models.

Usage::

    uv run python scripts/generate_schemas.py          # (re)write the files
    uv run python scripts/generate_schemas.py --check  # exit 1 if a committed file differs

The files go to ``src/async_task_api_worker/protocol/schemas/`` (shipped in the wheel, read with
``async_task_api_worker.protocol.schemas.load_schema``). docs/protocol.md, "JSON Schemas",
describes them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from async_task_api_worker.protocol import PROTOCOL_VERSION, CancelRequest, Envelope, Report

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_DIR = ROOT / "src" / "async_task_api_worker" / "protocol" / "schemas"
DIALECT = "https://json-schema.org/draft/2020-12/schema"
_REPORT_MODELS = ("StartedReport", "ProgressReport", "SuccessReport", "FailureReport")


def _with_header(schema: dict[str, Any], *, name: str, title: str) -> dict[str, Any]:
    return {
        "$schema": DIALECT,
        "$id": f"urn:asynctaskapi:protocol:{PROTOCOL_VERSION}:{name}",
        **schema,
        "title": title,
    }


def envelope_schema() -> dict[str, Any]:
    """Return the schema of the inbound envelope (what the decoder accepts, validation mode)."""
    return _with_header(
        Envelope.model_json_schema(mode="validation"),
        name="envelope",
        title=f"AsyncTaskAPI envelope, protocol version {PROTOCOL_VERSION}",
    )


def report_schema() -> dict[str, Any]:
    """Return the schema of a report: a ``oneOf`` of the four report types, keyed by ``type``.

    The canonical encoder writes every field of a report, ``payload: null`` and
    ``protocol_version`` included, so every property of each report type is made required
    (pydantic leaves fields with a default out of ``required``).

    pydantic's OpenAPI ``discriminator`` is left out: it is no JSON Schema keyword (ajv's
    strict mode refuses it, and ajv's own reading of it refuses its ``mapping``), and the
    ``oneOf`` is already decided by each branch's required ``type`` ``const``.
    """
    schema = TypeAdapter(Report).json_schema(mode="validation")
    schema.pop("discriminator", None)
    for model in _REPORT_MODELS:
        definition = schema["$defs"][model]
        definition["required"] = list(definition["properties"])
    return _with_header(
        schema,
        name="report",
        title=f"AsyncTaskAPI report, protocol version {PROTOCOL_VERSION}",
    )


def cancel_schema() -> dict[str, Any]:
    """Return the schema of a cancel request (what the decoder accepts, validation mode)."""
    return _with_header(
        CancelRequest.model_json_schema(mode="validation"),
        name="cancel",
        title=f"AsyncTaskAPI cancel request, protocol version {PROTOCOL_VERSION}",
    )


def render(schema: dict[str, Any]) -> str:
    """Return the committed text of a schema: sorted keys, 2-space indent, trailing newline."""
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def generated_files() -> dict[str, str]:
    """Return every schema file's name and expected text."""
    return {
        "envelope.schema.json": render(envelope_schema()),
        "report.schema.json": render(report_schema()),
        "cancel.schema.json": render(cancel_schema()),
    }


def main(argv: list[str] | None = None) -> int:
    """Write the schema files, or with ``--check`` compare them; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a committed file differs, write nothing"
    )
    args = parser.parse_args(argv)
    stale = []
    for name, text in generated_files().items():
        path = SCHEMA_DIR / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text, encoding="utf-8", newline="\n")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run scripts/generate_schemas.py", file=sys.stderr)
        return 1
    for name in stale:
        print(f"wrote {SCHEMA_DIR.relative_to(ROOT) / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
