r"""The canonical byte encoding of reports, and the strict JSON decoding of bodies.

Rules (docs/protocol.md, "Canonical encoding"), so that one report always gives the same bytes:

- UTF-8, no byte-order mark, no white space between tokens (``,`` and ``:`` separators);
- object keys sorted by Unicode code point, at every level;
- non-ASCII characters written as themselves, never as ``\\u`` escapes, except a lone surrogate
  (not encodable in UTF-8), written as a lower-case ``\\udxxx`` escape (an error message may
  hold one; a handler's response or payload may not: :func:`check_tree`);
- JSON's mandatory escapes only: ``\\"``, ``\\\\``, ``\\b \\f \\n \\r \\t`` and ``\\u00xx`` for the
  other control characters;
- integers in decimal, up to 4,300 digits; floats as the shortest text that reads back to the
  same IEEE-754 double, keeping a ``.0`` on integral values and switching to exponent form
  (``1e-05``, ``1e+16``) below 1e-4 or from 1e16 up; NaN and the infinities are refused.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, NoReturn

from async_task_api_worker.errors import ReportEncodeError

__all__ = [
    "NonFiniteNumberError",
    "MAX_NESTING_DEPTH",
    "MAX_REPORT_BYTES",
    "canonical_dumps",
    "check_tree",
    "lone_surrogate",
    "nesting_depth",
    "refuse_lone_surrogate",
    "strict_loads",
    "utf8_json",
]

#: The largest encoded report, in bytes: RabbitMQ 4.0's default ``max_message_size`` (16 MiB),
#: so that a report accepted here is accepted by every supported broker.
MAX_REPORT_BYTES = 16 * 1024 * 1024

#: The deepest nesting of arrays and objects in a body or a report (serde_json, a common
#: consumer, refuses more than 128 by default; 64 leaves room for the report around a payload).
MAX_NESTING_DEPTH = 64

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
#: Where :func:`lone_surrogate` is in a value: (the parent's place, a key or index), or the top.
_Place = tuple[Any, str | int] | None

_ENCODER = json.JSONEncoder(
    ensure_ascii=False,
    allow_nan=False,
    sort_keys=True,
    separators=(",", ":"),
    check_circular=True,
)


def _escape_surrogate(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def canonical_dumps(value: Any, *, tree_checked: bool = False) -> bytes:
    """Encode a JSON-compatible value to its canonical bytes.

    Args:
        value: ``dict`` (string keys), ``list``, ``tuple``, ``str``, ``int``, ``float``,
            ``bool`` or ``None``, nested at most :data:`MAX_NESTING_DEPTH` levels.
        tree_checked: the caller already ran :func:`check_tree` on every part of ``value``
            that could fail it (the report encoder, whose own fields are flat strings and
            numbers, checks the handler's response or payload alone).

    Returns:
        The canonical UTF-8 bytes.

    Raises:
        ReportEncodeError: the value holds a non-JSON type, a non-string key, NaN or an
            infinity, an integer over 4,300 digits, or nests too deep.
    """
    if not tree_checked:
        check_tree(value)
    try:
        text = _ENCODER.encode(value)
    except Exception as exc:  # TypeError, ValueError, RecursionError, or a dict changed mid-way
        if isinstance(exc, ReportEncodeError):
            raise
        raise ReportEncodeError(f"value is not canonical JSON: {type(exc).__name__}") from exc
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub(_escape_surrogate, text).encode("utf-8")


def check_tree(value: Any, *, depth: int = 1, valid_unicode: bool = False) -> None:
    r"""Refuse what ``json`` would silently accept: deep nesting, keys that are not text.

    The standard encoder turns ``int``, ``float``, ``bool`` and ``None`` keys into strings,
    so ``{1: "a"}`` would read back as ``{"1": "a"}``; a report must read back as written.
    Iterative, like :func:`nesting_depth`.

    With ``valid_unicode``, a lone surrogate (:func:`lone_surrogate`) is refused too, where the
    encoder would write it as a ``\udxxx`` escape: a handler's response or progress payload
    must be valid Unicode, an error message need not (docs/protocol.md, "Canonical encoding").
    The report encoder checks those so, and so does a child that writes its conclusion itself
    (``task_call.sendable``): every face refuses one alike, raw or read from an escape.

    Args:
        value: the value to check.
        depth: the level ``value`` sits at in the document it belongs to (1: the top).
        valid_unicode: refuse a lone surrogate in any string or key.

    Raises:
        ReportEncodeError: a key is not a string, ``value`` reaches past
            :data:`MAX_NESTING_DEPTH` levels, or (``valid_unicode``) it holds a lone
            surrogate: ``value is not valid Unicode: a lone surrogate U+D800 at notes.1``.
    """
    stack: list[tuple[Any, int]] = [(value, depth)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            for key in node:
                if not isinstance(key, str):
                    raise ReportEncodeError("value has an object key that is not a string")
                if valid_unicode and _surrogate_in(key) is not None:
                    refuse_lone_surrogate(value)
            children: Any = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            if valid_unicode and isinstance(node, str) and _surrogate_in(node) is not None:
                refuse_lone_surrogate(value)
            continue
        if depth > MAX_NESTING_DEPTH:
            raise ReportEncodeError(f"value nests deeper than {MAX_NESTING_DEPTH} levels")
        stack.extend((child, depth + 1) for child in children)


def refuse_lone_surrogate(value: Any) -> NoReturn:
    """Raise the refusal of ``value``, which holds a lone surrogate (:func:`lone_surrogate`).

    Raises:
        ReportEncodeError: always; its one wording names the code point and the place.
    """
    raise ReportEncodeError(f"value is not valid Unicode: a lone surrogate {lone_surrogate(value)}")


def lone_surrogate(value: Any) -> str | None:
    r"""Where ``value`` holds a lone surrogate, or ``None``: the one test of that rule.

    A lone surrogate is a code point from U+D800 to U+DFFF in a ``str``: UTF-8 has no form
    for it. A JSON reader joins an escaped pair (``\ud83d\ude00``) into its one character, so
    only an unpaired escape reads back as one; a Python string can also hold them raw (a file
    name read with ``surrogateescape``), a high one before a low one included. Every string
    and every object key is searched, at any depth (iteratively, like :func:`nesting_depth`).

    Args:
        value: a JSON-compatible value (``dict``, ``list``, ``tuple``, ``str``, scalars).

    Returns:
        ``"U+D800 at notes.1"``: the code point and the place of one of them, dotted as a
        validation error names a field (a list index as its number, ``(root)`` for ``value``
        itself); ``"U+DC00 in a key at tags.k\udc00"`` when an object key holds it (the key's
        surrogates written as escapes, so that the text is valid Unicode); ``None`` if there
        is none.
    """
    found = _surrogate_in(value) if isinstance(value, str) else None
    if found is not None:
        return f"U+{ord(found.group()):04X} at (root)"
    # Strings are searched where they are met; only objects and arrays are stacked, with their
    # place: (the parent's place, the key or index), a path built only once one is found.
    stack: list[tuple[Any, _Place]] = [(value, None)]
    while stack:
        node, place = stack.pop()
        if isinstance(node, dict):
            children: Any = node.items()
        elif isinstance(node, list | tuple):
            children = enumerate(node)
        else:
            continue
        for key, child in children:
            found = _surrogate_in(key) if isinstance(key, str) else None
            if found is not None:
                escaped = _LONE_SURROGATE.sub(_escape_surrogate, key)
                return f"U+{ord(found.group()):04X} in a key at {_dotted((place, escaped))}"
            if isinstance(child, str):
                found = _surrogate_in(child)
                if found is not None:
                    return f"U+{ord(found.group()):04X} at {_dotted((place, key))}"
            elif isinstance(child, dict | list | tuple):
                stack.append((child, (place, key)))
    return None


def _surrogate_in(text: str) -> re.Match[str] | None:
    # ``isascii`` reads a flag of the string: most strings are not searched at all.
    return None if text.isascii() else _LONE_SURROGATE.search(text)


def _dotted(place: _Place) -> str:
    parts: list[str] = []
    while place is not None:
        place, part = place
        parts.append(str(part))
    return ".".join(reversed(parts)) or "(root)"


class NonFiniteNumberError(ValueError):
    """A JSON number that is NaN, an infinity, or overflows a double (``1e400``)."""


def utf8_json(document: Any, **dumps: Any) -> str:
    r"""``document`` as JSON text that encodes to UTF-8 (``json.dumps`` with ``dumps``).

    Characters are kept as they are; only where a lone surrogate leaves no UTF-8 form is the
    whole text written with ``\u`` escapes (``ensure_ascii``).

    Raises:
        ValueError, TypeError: as ``json.dumps`` does.
    """
    text = json.dumps(document, ensure_ascii=False, **dumps)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(document, **dumps)
    return text


def _reject_constant(name: str) -> Any:
    raise NonFiniteNumberError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        # ``1e400`` is valid JSON syntax, but reads as infinity, which the protocol refuses.
        raise NonFiniteNumberError("a number that overflows to infinity is not valid JSON")
    return number


def strict_loads(text: str, *, float_type: Callable[[float], float] = float) -> Any:
    """Parse JSON text strictly: NaN and the infinities are refused.

    Duplicate keys keep the last value (as RFC 8259 leaves it to the reader and most readers do).

    Args:
        text: the JSON text.
        float_type: what a number written with a fraction or an exponent becomes (called with
            its ``float``); the conformance kit passes a float that never equals an integer.

    Raises:
        json.JSONDecodeError: the text is not JSON (message and position, never the text).
        NonFiniteNumberError: a NaN/Infinity literal, or a number too large for a double
            (``1e400``).
        ValueError: an integer over 4,300 digits (``sys.get_int_max_str_digits()``).
        RecursionError: nesting beyond the interpreter's recursion limit.
    """
    parse_float: Callable[[str], float] = (
        _finite_float if float_type is float else lambda s: float_type(_finite_float(s))
    )
    return json.loads(text, parse_constant=_reject_constant, parse_float=parse_float)


def nesting_depth(value: Any) -> int:
    """Return how deeply arrays and objects nest in ``value`` (a scalar is 0, ``{}`` is 1).

    Iterative, so that a pathological value cannot exhaust the stack.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list | tuple):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_NESTING_DEPTH:
            return depth
        stack.extend((child, depth + 1) for child in children)
    return deepest
