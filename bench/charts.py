"""The benchmark's two charts: throughput and round-trip latency per contender (matplotlib)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib as mpl

mpl.use("Agg")  # no screen: write files only
import matplotlib.pyplot as plt

if TYPE_CHECKING:
    from bench.__main__ import Row

_COLOURS = {"baseline": "#777777", "ours": "#1f77b4"}
_PEER = "#ff7f0e"


def _colour(key: str) -> str:
    return _COLOURS.get(key.split("-", maxsplit=1)[0], _PEER)


def draw(rows: list[Row], out: Path, suffix: str, subtitle: str) -> None:
    """Write ``throughput{suffix}.png`` and ``latency{suffix}.png`` into ``out``."""
    subtitle = "\n".join(textwrap.wrap(subtitle, 90))
    labels = [row.contender.label for row in rows]
    figure, axes = plt.subplots(figsize=(11, 0.45 * len(rows) + 2.2))
    rates = [row.tasks_per_s for row in rows]
    axes.barh(labels, rates, color=[_colour(row.contender.key) for row in rows])
    for position, rate in enumerate(rates):
        axes.text(rate, position, f" {rate:,.0f}", va="center", fontsize=8)
    if rows and rows[0].contender.key == "baseline":
        axes.axvline(rates[0], color="#777777", linestyle="--", linewidth=1)
    axes.set_xlim(0, max(rates) * 1.12)  # room for the value labels
    axes.invert_yaxis()
    axes.set_xlabel("tasks per second, draining pre-published tasks (median of runs)")
    axes.set_title(
        f"Throughput, one worker command (one process unless its label says)\n{subtitle}",
        fontsize=8,
    )
    figure.tight_layout()
    figure.savefig(out / f"throughput{suffix}.png", dpi=110)
    plt.close(figure)

    timed = [row for row in rows if row.round_trip_ms(0.5) is not None]
    if not timed:
        return
    figure, axes = plt.subplots(figsize=(11, 0.55 * len(timed) + 2.2))
    positions = range(len(timed))
    p50 = [row.round_trip_ms(0.5) or 0.0 for row in timed]
    p99 = [row.round_trip_ms(0.99) or 0.0 for row in timed]
    axes.barh([p - 0.2 for p in positions], p50, height=0.4, label="p50", color="#1f77b4")
    axes.barh([p + 0.2 for p in positions], p99, height=0.4, label="p99", color="#aec7e8")
    axes.set_yticks(list(positions), [row.contender.label for row in timed])
    axes.invert_yaxis()
    axes.set_xlabel(
        "round trip, ms: publish one task, wait for its terminal report (idle)\n"
        "only the contenders that publish reports"
    )
    axes.set_title(f"Latency\n{subtitle}", fontsize=8)
    axes.legend()
    figure.tight_layout()
    figure.savefig(out / f"latency{suffix}.png", dpi=110)
    plt.close(figure)
