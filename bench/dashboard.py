"""The Grafana dashboard as data: its panels, their PromQL made concrete, Prometheus's answers.

``bench/dashboard_picture.py`` draws a picture of ``deploy/grafana/async-task-api-worker.json``
from what this module reads out of it: every panel that has targets, with its title, type,
unit and grid position (``gridPos``: 24 columns, rows of Grafana's height unit), and each
target's ``expr`` and ``legendFormat``. Nothing about a panel is written twice: a panel added
to the JSON is drawn, and a template variable this module cannot fill stops the picture
(:func:`concrete`) instead of being sent to Prometheus as it is.

No matplotlib here (the unit tests import this module without the ``bench`` group).
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DASHBOARD",
    "Panel",
    "Series",
    "Target",
    "concrete",
    "format_value",
    "legend",
    "load_panels",
    "query_panels",
    "query_range",
]

DASHBOARD = (
    Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "async-task-api-worker.json"
)
_VARIABLE = re.compile(r"\$\{?(\w+)\}?")
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


@dataclass(frozen=True)
class Target:
    """One query of a panel: its ``refId``, PromQL (``expr``) and ``legendFormat``."""

    ref_id: str
    expr: str
    legend_format: str


@dataclass(frozen=True)
class Panel:
    """A panel of the dashboard: what the picture needs to draw it.

    ``x``, ``y``, ``w`` and ``h`` are its ``gridPos`` (24 columns; ``y`` and ``h`` in Grafana's
    row unit); ``unit`` is ``fieldConfig.defaults.unit`` (``"short"`` when absent, Grafana's
    default).
    """

    title: str
    kind: str
    unit: str
    x: int
    y: int
    w: int
    h: int
    targets: tuple[Target, ...]


@dataclass
class Series:
    """One series Prometheus returned for a target: its legend name and its points.

    ``times`` are Unix seconds; ``values`` are floats (``nan`` where Prometheus said ``NaN``).
    """

    name: str
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


def load_panels(path: Path = DASHBOARD) -> list[Panel]:
    """The panels of the dashboard at ``path`` that have targets, in the JSON's order.

    Rows and text panels (no ``targets``) are left out: they show no data.

    Raises:
        KeyError: a panel with targets has no ``gridPos`` or a target no ``expr``.
    """
    dashboard = json.loads(path.read_text())
    panels = []
    for raw in dashboard["panels"]:
        if not raw.get("targets"):
            continue
        grid = raw["gridPos"]
        panels.append(
            Panel(
                title=raw.get("title", ""),
                kind=raw.get("type", "timeseries"),
                unit=raw.get("fieldConfig", {}).get("defaults", {}).get("unit", "short"),
                x=grid["x"],
                y=grid["y"],
                w=grid["w"],
                h=grid["h"],
                targets=tuple(
                    Target(
                        ref_id=target.get("refId", ""),
                        expr=target["expr"],
                        legend_format=target.get("legendFormat", ""),
                    )
                    for target in raw["targets"]
                ),
            )
        )
    return panels


def concrete(expr: str, variables: Mapping[str, str]) -> str:
    """``expr`` with each ``$name`` or ``${name}`` replaced by ``variables[name]``.

    The caller gives what Grafana would: ``job`` (a regex, as the dashboard matches it with
    ``=~``) and ``__rate_interval`` (a duration such as ``10s``).

    Raises:
        KeyError: ``expr`` uses a variable that ``variables`` does not give (a variable added to
            the dashboard must be filled here on purpose, never sent to Prometheus raw).
    """
    missing = sorted({name for name in _VARIABLE.findall(expr) if name not in variables})
    if missing:
        raise KeyError(f"no value for the dashboard variable(s) {', '.join(missing)} in {expr}")
    return _VARIABLE.sub(lambda match: variables[match.group(1)], expr)


def legend(legend_format: str, labels: Mapping[str, str]) -> str:
    """A series' name as Grafana writes it: ``{{label}}`` filled from the series' labels.

    An empty format names the series by its labels (``{a="1"}``), as Grafana does.
    """
    if not legend_format:
        return "{" + ", ".join(f'{key}="{value}"' for key, value in labels.items()) + "}"
    return _LEGEND_LABEL.sub(lambda match: labels.get(match.group(1), ""), legend_format)


def query_range(
    base_url: str, query: str, start: float, end: float, step_s: float
) -> list[dict[str, Any]]:
    """Prometheus's ``/api/v1/query_range`` answer for ``query``: its ``result`` (a matrix).

    Raises:
        RuntimeError: Prometheus answered with ``status`` other than ``success``.
        OSError: Prometheus could not be reached.
    """
    parameters = urllib.parse.urlencode(
        {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
    )
    url = f"{base_url}/api/v1/query_range?{parameters}"
    with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 - our own http URL
        body = json.load(answer)
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {query!r}: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


Query = Callable[[str], list[dict[str, Any]]]


def query_panels(
    panels: list[Panel], variables: Mapping[str, str], query: Query
) -> dict[str, list[Series]]:
    """Each panel's series, by title: every target's concrete PromQL asked of ``query``.

    ``query`` takes a PromQL string and returns a ``query_range`` matrix (``metric`` and
    ``values`` per series). A panel's series come in its targets' order, then Prometheus's.

    Raises:
        KeyError: a target uses a variable that ``variables`` does not give.
    """
    answers: dict[str, list[Series]] = {}
    for panel in panels:
        series = answers.setdefault(panel.title, [])
        for target in panel.targets:
            for raw in query(concrete(target.expr, variables)):
                one = Series(name=legend(target.legend_format, raw.get("metric", {})))
                for at, value in raw["values"]:
                    one.times.append(float(at))
                    one.values.append(float(value))
                series.append(one)
    return answers


_IEC = ("B", "KiB", "MiB", "GiB", "TiB")
_SI = ("", " K", " Mil", " Bil", " Tri")


def format_value(unit: str, value: float) -> str:
    """``value`` written as Grafana writes its ``unit`` on an axis (a short form).

    ``ops`` is per second, ``s`` seconds (shown in ms or µs below 1 s), ``bytes`` IEC
    multiples, ``percentunit`` a fraction shown in %, ``short`` and any other unit SI-style
    suffixes.
    """
    if math.isnan(value):
        return ""
    if unit == "percentunit":
        return f"{_trim(value * 100)}%"
    if unit == "s":
        size = abs(value)
        if size == 0 or size >= 1:
            return f"{_trim(value)} s"
        if size >= 1e-3:
            return f"{_trim(value * 1e3)} ms"
        return f"{_trim(value * 1e6)} µs"
    if unit == "bytes":
        scaled, step = value, 0
        while abs(scaled) >= 1024 and step < len(_IEC) - 1:
            scaled, step = scaled / 1024, step + 1
        return f"{_trim(scaled)} {_IEC[step]}"
    scaled, step = value, 0
    while abs(scaled) >= 1000 and step < len(_SI) - 1:
        scaled, step = scaled / 1000, step + 1
    text = f"{_trim(scaled)}{_SI[step]}"
    return f"{text} ops/s" if unit == "ops" else text


def _trim(value: float) -> str:
    """Up to 4 significant digits, no trailing zeros (48.85 MiB and 48.9 MiB stay apart)."""
    return f"{value:.4g}"
