"""The dashboard's picture (bench/dashboard_picture.py) draws every panel of the JSON.

The picture itself needs Prometheus and a broker (minutes): it is made by hand, not here
(docs/operations.md, "The dashboard"). These tests check what it is made from: the panels and
PromQL read from deploy/grafana/async-task-api-worker.json, so that a panel added there is
drawn and a template variable added there stops the picture instead of reaching Prometheus.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from bench.dashboard import (
    DASHBOARD,
    concrete,
    format_value,
    legend,
    load_panels,
    query_panels,
)

ROOT = Path(__file__).resolve().parents[2]
PICTURE = ROOT / "docs" / "assets" / "dashboard.png"
VARIABLES = {"job": "conformance", "__rate_interval": "10s"}


def raw_panels() -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    return [panel for panel in panels if panel.get("targets")]


def fake_answers(asked: list[str]) -> Any:
    """A ``query_range`` stand-in: two points of one series per query, labelled like ours."""

    def query(promql: str) -> list[dict[str, Any]]:
        asked.append(promql)
        metric = {"status": "success", "code": "X", "pod": "worker-a", "version": "0.1.0"}
        return [{"metric": metric, "values": [[1000.0, "1"], [1001.0, "NaN"]]}]

    return query


def test_every_panel_with_targets_is_read_with_its_title_unit_grid_and_queries() -> None:
    panels = load_panels()
    raw = raw_panels()
    assert [panel.title for panel in panels] == [each["title"] for each in raw]
    for panel, each in zip(panels, raw, strict=True):
        assert (panel.x, panel.y, panel.w, panel.h) == tuple(
            each["gridPos"][key] for key in ("x", "y", "w", "h")
        )
        assert panel.unit == each["fieldConfig"]["defaults"]["unit"]
        assert panel.kind == each["type"]
        assert [(t.expr, t.legend_format) for t in panel.targets] == [
            (target["expr"], target["legendFormat"]) for target in each["targets"]
        ]


def test_each_target_is_asked_once_with_the_variables_filled() -> None:
    asked: list[str] = []
    series = query_panels(load_panels(), VARIABLES, fake_answers(asked))
    exprs = [target["expr"] for panel in raw_panels() for target in panel["targets"]]
    assert len(asked) == len(exprs)
    for promql, expr in zip(asked, exprs, strict=True):
        assert "$" not in promql
        assert promql == expr.replace("$__rate_interval", "10s").replace("$job", "conformance")
    assert list(series) == [panel["title"] for panel in raw_panels()]
    first = series["Tasks settled per second, by outcome"][0]
    assert first.name == "success"  # legendFormat {{status}}
    assert first.times == [1000.0, 1001.0]
    assert first.values[0] == 1.0 and math.isnan(first.values[1])


def test_a_variable_the_picture_does_not_fill_stops_it() -> None:
    assert concrete('up{job=~"${job}"}[$__rate_interval]', VARIABLES) == (
        'up{job=~"conformance"}[10s]'
    )
    with pytest.raises(KeyError, match=r"variable\(s\) pod in"):
        concrete('up{job=~"$job", pod=~"$pod"}', VARIABLES)


def test_legends_are_named_as_grafana_names_them() -> None:
    assert legend("publish {{ message_type }}", {"message_type": "success"}) == "publish success"
    assert legend("p95", {}) == "p95"
    assert legend("", {"pod": "a"}) == '{pod="a"}'


@pytest.mark.parametrize(
    ("unit", "value", "text"),
    [
        ("ops", 12.5, "12.5 ops/s"),
        ("ops", 0, "0 ops/s"),
        ("s", 0.25, "250 ms"),
        ("s", 2, "2 s"),
        ("s", 0.0004, "400 µs"),
        ("bytes", 48 * 1024 * 1024, "48 MiB"),
        ("percentunit", 0.035, "3.5%"),
        ("short", 2, "2"),
        ("short", 2500, "2.5 K"),
    ],
)
def test_values_are_written_in_the_panels_unit(unit: str, value: float, text: str) -> None:
    assert format_value(unit, value) == text


def test_the_operations_page_shows_the_picture_and_how_to_make_it() -> None:
    page = (ROOT / "docs" / "operations.md").read_text()
    assert "](assets/dashboard.png)" in page
    assert "python -m bench.dashboard_picture" in page
    assert 0 < PICTURE.stat().st_size < 300_000
