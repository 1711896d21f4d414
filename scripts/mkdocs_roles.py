"""MkDocs hook: the docstrings' Sphinx roles, shown as plain code in the API reference.

The package's docstrings cross-reference with reST roles (``:class:`Worker```,
``:meth:`~x.y.z```), which Markdown renders as the role's text before a code span. The site
shows the code span alone, the ``~`` form by its last name, as Sphinx would.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|data|attr|exc|mod|obj|const):<code>(~?)([^<]*)</code>")


def _shown(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html: str, **_: Any) -> str:
    """Rewrite each role before a code span as the code span."""
    return _ROLE.sub(_shown, html)
