"""Describing an exception without its text: what the logs may say about a handler's failure.

A handler's exception message can hold anything (a customer's data, a token in a URL), and so
can the source line that raised it. The SDK logs the exception's type and where it was raised,
never its message or code lines (docs/protocol.md, "Payloads and secrets").
"""

from __future__ import annotations

import traceback

__all__ = ["exception_type_name", "redact_url", "safe_traceback"]

_MAX_FRAMES = 50


def exception_type_name(exc: BaseException) -> str:
    """``module.QualifiedName`` of the exception's class (builtins without the module).

    For an exception raised in a task's child process (``RemoteHandlerError``), the name of
    the exception the child raised.
    """
    remote = getattr(exc, "remote_type_name", None)
    if isinstance(remote, str):
        return remote
    kind = type(exc)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def safe_traceback(exc: BaseException) -> str:
    """Format ``exc``'s traceback (and its causes) with frames and types only.

    Returns:
        Lines like ``File "app.py", line 12, in handle``, ending with the exception's type;
        no exception message, no source line, no local variable.
    """
    remote = getattr(exc, "remote_traceback", None)
    if isinstance(remote, str):
        return remote
    blocks: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = traceback.extract_tb(current.__traceback__)[-_MAX_FRAMES:]
        lines = [
            f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}' for frame in frames
        ]
        blocks.append("\n".join([*lines, exception_type_name(current)]))
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return "\nCaused by (or while handling):\n".join(reversed(blocks))


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (``amqp://user:***@host:5672/vhost``)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if ":" in host:  # an IPv6 literal
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port is not None else ""
        netloc = f"{parts.username or ''}:***@{host}{port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    except ValueError:
        return "(a URL that does not parse)"
