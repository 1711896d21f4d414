"""The protocol's JSON Schemas (draft 2020-12), shipped with the package.

``envelope.schema.json`` describes the inbound envelope, ``report.schema.json`` the four reports
(a ``oneOf`` keyed by ``type``), ``cancel.schema.json`` a cancel request on the control exchange.
All three are generated from the pydantic models by
``scripts/generate_schemas.py``; docs/protocol.md, "JSON Schemas", says where they are weaker
than the decoder.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Final

__all__ = ["SCHEMA_NAMES", "load_schema", "schema_bytes", "schema_file_name"]

#: The names :func:`load_schema` accepts.
SCHEMA_NAMES: Final = ("envelope", "report", "cancel")


def schema_file_name(name: str) -> str:
    """The file of schema ``name`` (``report`` -> ``report.schema.json``).

    Raises:
        ValueError: ``name`` is not one of :data:`SCHEMA_NAMES`.
    """
    if name not in SCHEMA_NAMES:
        raise ValueError(f"unknown schema {name!r}; expected one of {', '.join(SCHEMA_NAMES)}")
    return f"{name}.schema.json"


def schema_bytes(name: str) -> bytes:
    """The shipped file of schema ``name``, byte for byte (for a copy, as ``vectors`` makes).

    Raises:
        ValueError: ``name`` is not one of :data:`SCHEMA_NAMES`.
    """
    return resources.files(__name__).joinpath(schema_file_name(name)).read_bytes()


def load_schema(name: str) -> dict[str, Any]:
    """Load one of the shipped JSON Schemas.

    Args:
        name: ``"envelope"``, ``"report"`` or ``"cancel"``.

    Returns:
        The schema, a fresh dict on every call (the caller may change it).

    Raises:
        ValueError: ``name`` is not one of :data:`SCHEMA_NAMES`.
    """
    schema: dict[str, Any] = json.loads(schema_bytes(name).decode("utf-8"))
    return schema
