"""Draw the dashboard's panels with matplotlib, in its grid, from the series Prometheus gave.

Each panel of :func:`bench.dashboard.load_panels` gets the axes its ``gridPos`` gives (24
columns; Grafana's row unit is 30 px plus an 8 px gap, a column about 60 px on a 1440 px
screen, so a row unit is drawn 0.63 columns high). A ``timeseries`` panel is lines on a UTC
time axis with the panel's unit on the value axis and a legend list below it; a ``stat``
panel is the last value of each series, large, named by its legend. A series that is 0 (or
absent) all through the run is drawn but not named in the legend; the panel says how many.
"""

from __future__ import annotations

import io
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib as mpl

mpl.use("Agg")  # no screen: write files only
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator
from PIL import Image

from bench.dashboard import Panel, Series, format_value

__all__ = ["draw"]

_COLUMNS = 24
_ROW_UNIT = 0.63  # Grafana's row unit (38 px) in columns (60 px)
_INCHES_PER_COLUMN = 0.55
_HEADER_ROWS = 3.0  # the figure's title and caption, in row units
# Grafana's classic palette, first colours.
_PALETTE = ("#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9")
_QUIET = "#b0b7bf"  # a series at 0 all along
_PANEL_FACE = "#ffffff"
_PAGE_FACE = "#f4f5f5"


def draw(
    panels: list[Panel],
    series: dict[str, list[Series]],
    out: Path,
    *,
    title: str,
    caption: str,
    dpi: int = 80,
) -> list[str]:
    """Write the picture to ``out`` (PNG); the titles of the panels drawn, in order.

    Args:
        panels: the dashboard's panels (``load_panels``).
        series: each panel's series by title (``query_panels``); a panel absent from it is
            drawn as "No data".
        out: the PNG's path.
        title: the figure's title (the dashboard's).
        caption: a line under the title (how the picture was made).
        dpi: pixels per inch (the figure is 13.2 inches wide).
    """
    rows = max(panel.y + panel.h for panel in panels) + _HEADER_ROWS
    width = _COLUMNS * _INCHES_PER_COLUMN
    height = rows * _ROW_UNIT * _INCHES_PER_COLUMN
    figure = plt.figure(figsize=(width, height), facecolor=_PAGE_FACE)
    figure.text(0.01, 1 - 0.9 / rows, title, fontsize=15, weight="bold", va="center")
    figure.text(0.01, 1 - 2.0 / rows, caption, fontsize=8.5, color="#464c54", va="center")
    drawn = []
    for panel in panels:
        axes = figure.add_axes(_box(panel, rows), facecolor=_PANEL_FACE)
        _frame(axes, panel.title)
        found = series.get(panel.title, [])
        if panel.kind == "stat":
            _stat(axes, panel, found)
        else:
            _timeseries(axes, panel, found)
        drawn.append(panel.title)
    drawn_png = io.BytesIO()
    figure.savefig(drawn_png, dpi=dpi, facecolor=_PAGE_FACE)
    plt.close(figure)
    # 256 colours hold a chart's lines and antialiasing: a third of the RGB file's size.
    with Image.open(drawn_png) as picture:
        picture.convert("RGB").quantize(256).save(out, optimize=True)
    return drawn


def _box(panel: Panel, rows: float) -> tuple[float, float, float, float]:
    """The panel's plot area in figure fractions, inside its grid cell.

    Room is left for the title, the value axis's labels and the legend.
    """
    left = (panel.x + 1.6) / _COLUMNS
    width = (panel.w - 1.9) / _COLUMNS
    top = 1 - (_HEADER_ROWS + panel.y + 0.75) / rows
    bottom = 1 - (_HEADER_ROWS + panel.y + panel.h - 1.55) / rows
    if panel.kind == "stat":
        left, width, bottom = (
            panel.x / _COLUMNS + 0.005,
            panel.w / _COLUMNS - 0.01,
            bottom - 0.9 / rows,
        )
    return left, bottom, width, top - bottom


def _frame(axes: Axes, title: str) -> None:
    axes.set_title(title, loc="left", fontsize=10, weight="bold", color="#24292e", pad=6)
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        axes.spines[side].set_color("#c7d0d9")
    axes.tick_params(labelsize=7.5, colors="#464c54")
    axes.grid(color="#e9edf2", linewidth=0.8)


def _timeseries(axes: Axes, panel: Panel, found: list[Series]) -> None:
    if not found:
        _no_data(axes)
        return
    silent = 0
    for index, one in enumerate(found):
        times = [datetime.fromtimestamp(at, UTC) for at in one.times]
        quiet = all(value == 0 or math.isnan(value) for value in one.values)
        colour = _QUIET if quiet else _PALETTE[(index - silent) % len(_PALETTE)]
        silent += quiet
        axes.plot(
            times,
            one.values,
            color=colour,
            linewidth=1.3,
            label="_" if quiet else one.name,  # "_": drawn, not in the legend
        )
    axes.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=UTC))
    axes.xaxis.set_major_locator(mdates.SecondLocator(bysecond=(0, 30)))
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: format_value(panel.unit, value)))
    if all(value == 0 or math.isnan(value) for one in found for value in one.values):
        axes.set_ylim(0, 1)  # an axis for a flat 0, as Grafana draws one
    if panel.unit == "bytes":
        axes.yaxis.set_major_locator(_BinaryLocator(nbins=6))
    axes.margins(x=0)
    handles, labels = axes.get_legend_handles_labels()
    if silent:
        handles.append(Line2D([], [], linestyle="none"))
        labels.append(f"({silent} series at 0 all along)")
    if not handles:
        return
    axes.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(0, -0.14),
        ncol=min(len(handles), 6),
        fontsize=7.5,
        frameon=False,
        handlelength=1.2,
        columnspacing=1.2,
        borderaxespad=0,
    )


class _BinaryLocator(MaxNLocator):
    """Ticks at round multiples of a power of 1024 (1 MiB steps, not 1,048,576 / 1e6)."""

    def tick_values(self, vmin: float, vmax: float) -> Any:
        base = 1024 ** max(0, int(math.log(max(abs(vmax), 1.0), 1024)))
        return super().tick_values(vmin / base, vmax / base) * base


def _stat(axes: Axes, panel: Panel, found: list[Series]) -> None:
    axes.set_axis_off()
    if not found:
        _no_data(axes)
        return
    for index, one in enumerate(found):
        last = next((value for value in reversed(one.values) if not math.isnan(value)), math.nan)
        centre = (index + 0.5) / len(found)
        axes.text(
            centre,
            0.55,
            format_value(panel.unit, last),
            ha="center",
            va="center",
            fontsize=26,
            color=_PALETTE[0],
            weight="bold",
            transform=axes.transAxes,
        )
        axes.text(
            centre,
            0.12,
            one.name,
            ha="center",
            va="center",
            fontsize=9,
            color="#464c54",
            transform=axes.transAxes,
        )


def _no_data(axes: Axes) -> None:
    axes.text(0.5, 0.5, "No data", ha="center", va="center", transform=axes.transAxes)
