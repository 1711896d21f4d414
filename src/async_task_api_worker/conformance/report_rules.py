"""The rules every report is held to, whatever the case that reads it.

The kit reads each report (:class:`Seen`) with its number types kept: a number written with a
fraction or an exponent is a :class:`Float`, which never equals an integer, so that no
comparison of any case takes a ``"protocol_version":1.0`` or an ``"attempt":1.0`` for ``1``
(Python's ``1.0 == 1`` would, and so does a JSON Schema's ``integer``). Then
:class:`ReportRules` holds every report of the kit's tasks to what does not depend on the case
(docs/protocol.md, "Reports" and "Ordering and duplicates"):

- **the echoed fields**: ``client_id`` as the worker recovers it from the body the kit sent
  (``protocol.envelope.decode_envelope``: the envelope's, or ``null`` from a poison body without
  a readable one), ``service`` the worker's own, ``protocol_version`` the integer 1. The
  ``task_id`` is how a report is found: a report whose task id the kit never sent (a stale one
  of another run) is not checked here, and the case waiting for the right one sees nothing;
- **the number types**: ``attempt`` an integer of at least 1, a ``progress`` report's
  ``fraction`` a float (``0.0``, not ``0``) in [0, 1);
- **timestamps**: each of the one form, UTC with six fraction digits (``…46.123456Z``, not
  ``…46.123Z``), and in order: within one delivery (the reports of one task and attempt, from
  the one whose ``seq`` is 0), no report's ``timestamp`` is earlier than an earlier report's.

The report schema also judges these fields (:data:`RULED_FIELDS`); the ``encoding`` case
leaves them to this module, so that a defect is said once, here.

Each rule is reported once a run, by the first case whose reports break it: a worker that
breaks it in every report fails that case alone (``round_trip`` when it runs), and the
verdicts name each defect once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from async_task_api_worker.conformance.differences import MISSING, shown
from async_task_api_worker.errors import EnvelopeDecodeError
from async_task_api_worker.protocol.encoding import strict_loads
from async_task_api_worker.protocol.envelope import decode_envelope
from async_task_api_worker.protocol.reports import TIMESTAMP_PATTERN

__all__ = ["RULED_FIELDS", "Float", "ReportRules", "Seen", "read_json"]

_TIMESTAMP: Final = re.compile(TIMESTAMP_PATTERN, re.ASCII)
#: The report fields whose every rule (the report schema's among them) this module judges.
RULED_FIELDS: Final = frozenset(
    {"protocol_version", "client_id", "service", "attempt", "fraction", "timestamp"}
)


class Float(float):
    """A JSON number written with a fraction or an exponent (``1.0``, ``2e3``).

    It never equals an integer (``Float(1.0) == 1`` is false), and is a float otherwise: its
    canonical encoding is the float's (``1.0``).
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int):  # bool included
            return False
        return float.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        if isinstance(other, int):
            return True
        return float.__ne__(self, other)

    __hash__ = float.__hash__


def read_json(body: bytes) -> dict[str, Any] | None:
    """``body`` read as a JSON object, its floats as :class:`Float`.

    Returns:
        The object; ``None`` when the body is not UTF-8, not strict JSON (``NaN``, ``1e400``)
        or not an object.
    """
    try:
        document = strict_loads(body.decode("utf-8"), float_type=Float)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) else None


@dataclass(frozen=True, slots=True)
class Seen:
    """One report as it arrived.

    Attributes:
        body: the exact bytes.
        document: the body read by :func:`read_json` (``None`` when it is not a JSON object).
        properties: the AMQP properties the protocol names (``content_type``, ``message_id``...;
            ``timestamp`` in seconds since the epoch, a fraction when the worker wrote
            milliseconds, ``None`` when absent).
        at: when it arrived, on the kit's monotonic clock, in seconds.
    """

    body: bytes
    document: dict[str, Any] | None
    properties: dict[str, Any]
    at: float

    @property
    def type(self) -> str | None:
        """The report's ``type`` field, if it has one."""
        value = None if self.document is None else self.document.get("type")
        return value if isinstance(value, str) else None

    @property
    def terminal(self) -> bool:
        """Whether this is a ``success`` or a ``failure``."""
        return self.type in ("success", "failure")


@dataclass(frozen=True, slots=True)
class _Echo:
    """What the reports of one task carry back: its client id as the worker recovers it."""

    client_id: str | None
    poison: bool


@dataclass
class ReportRules:
    """Holds every report to the rules of the module; one for a run of the kit.

    Call :meth:`sent` with every body the kit publishes, and :meth:`check` with every report
    in the order they arrived.
    """

    _echoes: dict[str, _Echo] = field(default_factory=dict)
    #: (task id, attempt as shown) -> the latest timestamp of that delivery so far.
    _latest: dict[tuple[str, str], str] = field(default_factory=dict)
    #: The rules some report broke already this run.
    _broken: set[str] = field(default_factory=set)

    def sent(self, body: bytes) -> None:
        """Note what the reports of the task in ``body`` must echo (nothing: no task id)."""
        try:
            envelope = decode_envelope(body, max_body_bytes=len(body))
        except EnvelopeDecodeError as error:
            if error.task_id is not None:
                self._echoes[error.task_id] = _Echo(error.client_id, poison=True)
            return
        self._echoes[envelope.task_id] = _Echo(envelope.client_id, poison=False)

    def check(self, seen: Seen, service: str) -> list[str]:
        """The problems of ``seen``, the worker's (named ``service``), with unbroken rules.

        Returns:
            One line per rule it breaks that no earlier report broke this run.
        """
        problems = [
            (rule, text) for rule, text in self._problems(seen, service) if rule not in self._broken
        ]
        self._broken.update(rule for rule, _ in problems)
        return [text for _, text in problems]

    def _problems(self, seen: Seen, service: str) -> Iterator[tuple[str, str]]:
        document = seen.document
        task_id = None if document is None else document.get("task_id")
        echo = self._echoes.get(task_id) if isinstance(task_id, str) else None
        if document is None or echo is None or task_id is None:
            return  # not a report of the kit's tasks: the cases judge what they wait for
        label = seen.properties.get("message_id") or task_id
        version = document.get("protocol_version", MISSING)
        if type(version) is not int or version != 1:
            yield "protocol_version", f"{label}: protocol_version is {shown(version)}, not 1"
        client_id = document.get("client_id", MISSING)
        if client_id is MISSING or client_id != echo.client_id:
            source = "as recovered from the poison body" if echo.poison else "the envelope's"
            yield (
                "client_id",
                f"{label}: client_id is {shown(client_id)}, not {shown(echo.client_id)} ({source})",
            )
        own = document.get("service", MISSING)
        if own != service:
            yield (
                "service",
                f"{label}: service is {shown(own)}, not the worker's {shown(service)}",
            )
        attempt = document.get("attempt", MISSING)
        if type(attempt) is not int or attempt < 1:
            yield "attempt", f"{label}: attempt is {shown(attempt)}, not an integer of at least 1"
        if document.get("type") == "progress":
            fraction = document.get("fraction", MISSING)
            if not isinstance(fraction, Float) or not 0 <= fraction < 1:
                yield "fraction", f"{label}: fraction is {shown(fraction)}, not a float in [0, 1)"
        delivery = (task_id, shown(attempt))
        if str(seen.properties.get("message_id")).endswith("/0"):
            self._latest.pop(delivery, None)  # seq 0: a delivery's first report
        stamp = document.get("timestamp", MISSING)
        if not isinstance(stamp, str) or not _TIMESTAMP.fullmatch(stamp):
            yield (
                "timestamp_form",
                f"{label}: timestamp is {shown(stamp)}, not UTC with six fraction digits "
                f"(YYYY-MM-DDTHH:MM:SS.ffffffZ)",
            )
            return
        latest = self._latest.get(delivery)
        # One fixed format, zero-padded: the text sorts as the moment does.
        if latest is not None and stamp < latest:
            yield (
                "timestamp",
                f"{label}: timestamp {stamp} goes back from {latest}, an earlier report's "
                f"in the same delivery",
            )
        self._latest[delivery] = max(stamp, latest or stamp)
