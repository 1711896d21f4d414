"""How what a worker sent differs from what the kit expected, said in one short line.

A verdict's line names what to fix: where the bytes of a report first part from its canonical
encoding (:func:`byte_difference`), the first path where a value or its type is not the one
the handler gave (:func:`value_difference`, on a report read with its number types kept,
``report_rules.Float``), and where a report breaks its JSON Schema (:func:`schema_lines`: the
error's JSON path, keyword and a short message, never the whole document).
"""

from __future__ import annotations

import json
import re
from collections.abc import Container, Iterable, Sequence
from typing import Any, Final, Protocol

from async_task_api_worker.protocol.encoding import canonical_dumps

__all__ = [
    "AROUND_BYTES",
    "MESSAGE_CHARS",
    "MISSING",
    "SchemaError",
    "byte_difference",
    "schema_lines",
    "shown",
    "value_difference",
]

#: A field or an item that is not there, as the lines show it (``missing``).
MISSING: Final = object()
#: The bytes shown on each side of the first difference.
AROUND_BYTES: Final = 30
#: The length of a schema error's message in a line, in characters.
MESSAGE_CHARS: Final = 100
#: A key written ``.key`` in a path; any other as ``["key"]``.
_PLAIN_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


def shown(value: object) -> str:
    """``value`` as JSON text (``1.0``, ``null``, ``"text"``), cut to 60 characters."""
    if value is MISSING:
        return "missing"
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def byte_difference(expected: bytes, actual: bytes, around: int = AROUND_BYTES) -> str:
    """Where ``actual`` first differs from ``expected``, with up to ``around`` bytes each side.

    Returns:
        ``at byte N (of E expected, A sent): expected b'...', sent b'...'``: ``N`` counts from
        0; ``...`` outside the quotes marks bytes left out. Meant for two bodies that differ.
    """
    at = next(
        (i for i, (e, a) in enumerate(zip(expected, actual, strict=False)) if e != a),
        min(len(expected), len(actual)),
    )
    start = max(at - around, 0)

    def excerpt(body: bytes) -> str:
        cut = body[start : at + around]
        before = "..." if start > 0 else ""
        after = "..." if at + around < len(body) else ""
        return f"{before}{cut!r}{after}"

    return (
        f"at byte {at:,} (of {len(expected):,} expected, {len(actual):,} sent): "
        f"expected {excerpt(expected)}, sent {excerpt(actual)}"
    )


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _described(value: object, absent: str) -> str:
    if value is MISSING:
        return absent
    if value is None:
        return "null"
    return f"{shown(value)} ({_kind(value)})"


def _key_path(path: str, key: str) -> str:
    if _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def value_difference(expected: Any, actual: Any, path: str, verb: str = "returned") -> str | None:
    """The first path where ``actual`` is not ``expected``, value for value, type for type.

    Args:
        expected: what the handler was asked to give (a JSON value, or :data:`MISSING`).
        actual: what the report holds, read with its number types kept (``1.0`` a float, ``1``
            an int: ``report_rules.read_json``), or :data:`MISSING`.
        path: where ``actual`` is in the report (``response``; empty for the report itself).
        verb: how the line says the handler gave it (``returned``, ``reported``).

    Returns:
        ``None`` when they are the same (their canonical encodings are equal); else one line:
        ``response.a: 1 (int) where 1.0 (float) was returned``. Object keys are visited in the
        canonical order, so the first difference is the first in the bytes.
    """
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(expected.keys() | actual.keys()):
            found = value_difference(
                expected.get(key, MISSING), actual.get(key, MISSING), _key_path(path, key), verb
            )
            if found is not None:
                return found
        return None
    if isinstance(expected, list | tuple) and isinstance(actual, list | tuple):
        for index in range(max(len(expected), len(actual))):
            found = value_difference(
                expected[index] if index < len(expected) else MISSING,
                actual[index] if index < len(actual) else MISSING,
                f"{path}[{index}]",
                verb,
            )
            if found is not None:
                return found
        return None
    same = (
        expected is not MISSING
        and actual is not MISSING
        and _kind(expected) == _kind(actual)
        and canonical_dumps(expected) == canonical_dumps(actual)
    )
    if same or (expected is MISSING and actual is MISSING):
        return None
    sent, given = _described(actual, "missing"), _described(expected, "nothing")
    return f"{path or 'the value'}: {sent} where {given} was {verb}"


class SchemaError(Protocol):
    """What :func:`schema_lines` reads of a ``jsonschema.ValidationError``."""

    @property
    def json_path(self) -> str: ...  # noqa: D102 - jsonschema's
    @property
    def validator(self) -> Any: ...  # noqa: D102 - the keyword
    @property
    def message(self) -> str: ...  # noqa: D102
    @property
    def instance(self) -> Any: ...  # noqa: D102
    @property
    def validator_value(self) -> Any: ...  # noqa: D102 - the keyword's value in the schema
    @property
    def absolute_path(self) -> Sequence[Any]: ...  # noqa: D102
    @property
    def relative_schema_path(self) -> Sequence[Any]: ...  # noqa: D102
    @property
    def context(self) -> Sequence[SchemaError] | None: ...  # noqa: D102


def _narrowed(error: SchemaError) -> list[SchemaError]:
    """A ``oneOf``/``anyOf`` error as the errors of the branch meant, when one is.

    The branch meant is the one whose ``const`` holds (the report's ``type``), then the one
    with the fewest errors: a started report with a bad timestamp breaks every branch of the
    report schema, and its own by that timestamp alone. With no single such branch, the error
    stays as it is.
    """
    if not error.context:
        return [error]
    branches: dict[Any, list[SchemaError]] = {}
    for inner in error.context:
        branches.setdefault(inner.relative_schema_path[0], []).append(inner)

    def rank(errors: list[SchemaError]) -> tuple[bool, int]:
        return any(inner.validator == "const" for inner in errors), len(errors)

    ranked = sorted(branches.values(), key=rank)
    if len(ranked) > 1 and rank(ranked[0]) == rank(ranked[1]):
        return [error]  # no branch is closer than another
    return [narrow for inner in ranked[0] for narrow in _narrowed(inner)]


def _message(error: SchemaError) -> str:
    """The error's message, an object or array it quotes named instead, cut."""
    message = error.message
    instance = error.instance
    if isinstance(instance, dict | list) and message.startswith(repr(instance)):
        message = ("the object" if isinstance(instance, dict) else "the array") + message[
            len(repr(instance)) :
        ]
    return message if len(message) <= MESSAGE_CHARS else f"{message[: MESSAGE_CHARS - 3]}..."


def _field(error: SchemaError) -> str | None:
    """The top-level field an error is about: its path's first step, or the one required."""
    if error.absolute_path:
        return str(error.absolute_path[0])
    if error.validator == "required":
        # jsonschema makes one error of each missing property: "'name' is a required property".
        return next(
            (
                name
                for name in error.validator_value
                if isinstance(name, str) and error.message == f"{name!r} is a required property"
            ),
            None,
        )
    return None


def schema_lines(
    errors: Iterable[SchemaError], leave: Container[str] = (), at_most: int = 2
) -> list[str]:
    """The schema's errors as short lines: ``$.timestamp (pattern): '...' does not match '...'``.

    Args:
        errors: a validator's ``iter_errors(document)``.
        leave: top-level fields whose errors are left out (another rule of the kit judges them).
        at_most: the lines returned, at most.

    Returns:
        Each error's JSON path, keyword and message (cut to :data:`MESSAGE_CHARS`); a
        ``oneOf`` narrowed to the branch the document is closest to.
    """
    lines: list[str] = []
    for error in errors:
        for narrow in _narrowed(error):
            if _field(narrow) in leave:
                continue
            lines.append(f"{narrow.json_path} ({narrow.validator}): {_message(narrow)}")
            if len(lines) >= at_most:
                return lines
    return lines
