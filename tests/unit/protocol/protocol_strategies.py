"""Hypothesis strategies and helpers shared by the protocol property tests."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

from async_task_api_worker.protocol import ID_PATTERN, SERVICE_PATTERN, format_timestamp
from async_task_api_worker.protocol.encoding import MAX_NESTING_DEPTH, nesting_depth

__all__ = [
    "ids",
    "joined",
    "json_objects",
    "json_values",
    "plain_texts",
    "same",
    "service_names",
    "texts",
    "timestamps",
    "valid_texts",
]

#: Characters that exercise the escaping rules, mixed into every generated text.
_TRICKY = ['"', "\\", "/", "\x00", "\x1f", "\x7f", "\x85", "\u2028", "\u2029", "\ufeff", "😀"]

_characters = st.one_of(
    st.characters(),  # any code point but surrogates
    st.characters(categories=["Cs"]),  # surrogates only
    st.sampled_from(_TRICKY),
)

# (st.text() would merge the alphabets and drop the surrogates again: build from lists.)
#: Text including lone surrogates (and sometimes a high surrogate followed by a low one).
texts = st.lists(_characters, max_size=24).map("".join)
# codec="utf-8": st.characters() alone still yields a surrogate now and then.
_valid_characters = st.one_of(st.characters(codec="utf-8"), st.sampled_from(_TRICKY))
#: Text without surrogates, for the key-order property.
plain_texts = st.lists(_valid_characters, max_size=12).map("".join)
#: Valid Unicode text (no surrogate): what a response or a progress payload may hold.
valid_texts = st.lists(_valid_characters, max_size=24).map("".join)

_integers = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**2000), max_value=2**2000),
    st.sampled_from([2**200, -(2**200), 10**4299, -(10**4299), 2**63, -(2**63) - 1, 2**64]),
)
_floats = st.floats(allow_nan=False, allow_infinity=False)


def json_values(
    keys: st.SearchStrategy[str] = texts, strings: st.SearchStrategy[str] = texts
) -> st.SearchStrategy[Any]:
    """Arbitrary JSON-compatible values: dicts with ``keys``, lists, and the scalars."""
    return st.recursive(
        st.one_of(st.none(), st.booleans(), _integers, _floats, strings),
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4)
        ),
        max_leaves=24,
    ).filter(lambda value: nesting_depth(value) <= MAX_NESTING_DEPTH)


def json_objects(
    keys: st.SearchStrategy[str] = texts, strings: st.SearchStrategy[str] = texts
) -> st.SearchStrategy[dict[str, Any]]:
    """Arbitrary JSON objects, nested so that a report around them stays within the limit."""
    return st.dictionaries(keys, json_values(keys, strings), max_size=5).filter(
        lambda value: nesting_depth(value) < MAX_NESTING_DEPTH
    )


ids = st.from_regex(ID_PATTERN, fullmatch=True)
service_names = st.from_regex(SERVICE_PATTERN, fullmatch=True)
timestamps = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
).map(format_timestamp)


def joined(value: Any) -> Any:
    """``value`` as a JSON reader sees it after canonical encoding.

    A high surrogate directly followed by a low one is written as two escapes, which every
    JSON reader joins into one supplementary character (docs/protocol.md, "Canonical
    encoding"); truly lone surrogates stay as they are.
    """
    if isinstance(value, str):
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    if isinstance(value, list | tuple):
        return [joined(item) for item in value]
    if isinstance(value, dict):
        return {joined(key): joined(item) for key, item in value.items()}
    return value


def same(left: Any, right: Any) -> bool:
    """Deep equality that tells ``True`` from ``1``, ``1.0`` from ``1``, ``-0.0`` from ``0.0``."""
    if type(left) is not type(right):
        return False
    if isinstance(left, float):
        return left == right and math.copysign(1.0, left) == math.copysign(1.0, right)
    if isinstance(left, list):
        return len(left) == len(right) and all(map(same, left, right))
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(same(left[key], right[key]) for key in left)
    return bool(left == right)
