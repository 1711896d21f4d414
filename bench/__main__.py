"""The benchmark: every contender in turn against the local RabbitMQ, a table and two charts.

Run from the repository's root (RabbitMQ on 127.0.0.1:5672, ``rabbitmqctl`` usable)::

    uv sync --locked --all-extras --group bench     # once: the peers and matplotlib
    uv run --group bench python -m bench            # 10,000 tasks x 3 runs, then the leak check
    uv run python -m bench --smoke                  # 50 tasks, the baseline and ours (CI)

The table gives medians over the runs and each contender's throughput as a ratio to the
baseline's; ``--out`` (default ``docs/bench``) receives ``results.json`` (every run's figures),
``results.md`` and, when matplotlib is installed, ``throughput.png`` and ``latency.png``
(``-quorum`` suffixed for ``--queue-type quorum``); ``--replot results.json`` redraws them.
See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.contenders import CONTENDERS, Contender, available
from bench.measure import REPO, Run, Skipped, one_run, rabbitmqctl

_PACKAGES = (
    "async-task-api-worker",
    "aio-pika",
    "uvloop",
    "celery",
    "dramatiq",
    "faststream",
    "taskiq",
    "taskiq-aio-pika",
    "taskiq-redis",
    "redis",
)


@dataclass
class Row:
    """One contender's medians over its runs."""

    contender: Contender
    runs: list[Run]

    @property
    def tasks_per_s(self) -> float:
        """The median throughput, in tasks per second."""
        return statistics.median(r.tasks_per_s for r in self.runs)

    def median(self, name: str) -> float:
        """The median of the runs' field ``name``."""
        return statistics.median(getattr(r, name) for r in self.runs)

    def median_or_none(self, name: str) -> float | None:
        """The median of the runs' field ``name`` where measured (older results lack some)."""
        values = [value for r in self.runs if (value := getattr(r, name)) is not None]
        return statistics.median(values) if values else None

    def round_trip_ms(self, fraction: float) -> float | None:
        """The median over the runs of a round-trip percentile, in ms; ``None``: no reports."""
        per_run = [_percentile(r.round_trips_s, fraction) for r in self.runs if r.round_trips_s]
        return statistics.median(per_run) * 1000 if per_run else None


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _versions() -> str:
    found = []
    for name in _PACKAGES:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        broker = rabbitmqctl("version").strip()
    except Exception:
        broker = "?"
    return ", ".join([f"RabbitMQ {broker}", f"Python {platform.python_version()}", *found])


def _machine() -> str:
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return f"{platform.machine()}, {os.cpu_count()} CPUs ({model})"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[Row], queue_type: str) -> list[str]:
    """The Markdown table of the medians."""
    base = rows[0].tasks_per_s if rows and rows[0].contender.key == "baseline" else None
    lines = [
        f"| contender ({queue_type} queues) | tasks/s | runs' range | x baseline | CPU ms/task "
        "| broker CPU ms/task | round trip p50 ms | p99 ms | idle RSS MiB | RSS after 1k MiB "
        "| RSS at end MiB | peak RSS MiB | SIGTERM to exit s | exit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        rate = row.tasks_per_s
        rates = [r.tasks_per_s for r in row.runs]
        lines.append(
            f"| {row.contender.label} | {rate:,.0f} | {min(rates):,.0f} to {max(rates):,.0f} "
            f"| {_fmt(base and rate / base, '.2f')} "
            f"| {row.median('cpu_ms_per_task'):.3f} | {row.median('broker_cpu_ms_per_task'):.3f} "
            f"| {_fmt(row.round_trip_ms(0.5), '.2f')} | {_fmt(row.round_trip_ms(0.99), '.2f')} "
            f"| {_fmt(row.median_or_none('idle_rss_mb'), '.1f')} "
            f"| {row.median('rss_early_mb'):.1f} | {row.median('rss_end_mb'):.1f} "
            f"| {row.median('peak_rss_mb'):.1f} | {row.median('shutdown_s'):.2f} "
            f"| {','.join(sorted({str(r.exit_code) for r in row.runs}))} |"
        )
    return lines


def leak_table(rows: list[Row], tasks: int) -> list[str]:
    """The leak check: RSS after 1,000 tasks against RSS after ``tasks``."""
    lines = [
        f"| contender | idle RSS MiB | RSS after 1,000 MiB | RSS after {tasks:,} MiB | growth |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        early, end = row.median("rss_early_mb"), row.median("rss_end_mb")
        growth = 100 * (end / early - 1)
        idle = _fmt(row.median_or_none("idle_rss_mb"), ".1f")
        lines.append(
            f"| {row.contender.label} | {idle} | {early:.1f} | {end:.1f} | {growth:+.1f} % |"
        )
    return lines


def _run_rows(
    contenders: list[Contender],
    tasks: int,
    runs: int,
    round_trips: int,
    *,
    queue_type: str,
    skipped: list[str],
) -> list[Row]:
    """Each contender's runs; one that raises :class:`Skipped` is left out, said in ``skipped``."""
    rows = []
    for contender in contenders:
        results = []
        try:
            for number in range(runs):
                print(f"# {contender.key}: run {number + 1} of {runs}", file=sys.stderr, flush=True)
                results.append(
                    one_run(contender, tasks, round_trips=round_trips, queue_type=queue_type)
                )
        except Skipped as exc:
            print(f"# skipped {exc}", flush=True)
            skipped.append(str(exc))
            continue
        rows.append(Row(contender, results))
        print(table(rows, queue_type)[-1], flush=True)
    return rows


def main() -> None:
    """Run the contenders, print the table, write the results file and the charts."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks drained per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per contender (median)")
    parser.add_argument("--round-trips", type=int, default=500, help="round trips per run")
    parser.add_argument("--leak-tasks", type=int, default=50_000, help="0 skips the leak check")
    parser.add_argument("--leak-only", default="baseline,ours-c8", help="contenders to check")
    parser.add_argument("--queue-type", choices=["classic", "quorum"], default="classic")
    parser.add_argument("--only", default="", help="comma-separated contender keys")
    parser.add_argument(
        "--out", type=Path, help="where the results go (default docs/bench; none for --smoke)"
    )
    parser.add_argument("--smoke", action="store_true", help="50 tasks, 1 run, baseline + ours")
    parser.add_argument(
        "--replot", type=Path, help="rewrite results*.md and the charts from a results*.json"
    )
    arguments = parser.parse_args()
    if arguments.replot:
        write_results(json.loads(arguments.replot.read_text()), arguments.replot)
        return
    wanted = [key for key in arguments.only.split(",") if key]
    unknown = sorted(set(wanted) - {c.key for c in CONTENDERS})
    if unknown:
        parser.error(
            f"unknown contender(s) {', '.join(unknown)}; "
            f"known: {', '.join(c.key for c in CONTENDERS)}"
        )
    contenders = [c for c in CONTENDERS if not wanted or c.key in wanted]
    if arguments.smoke:
        arguments.tasks, arguments.runs, arguments.round_trips = 50, 1, 5
        arguments.leak_tasks = 0
        contenders = [c for c in contenders if c.smoke]
    skipped = [c.key for c in contenders if not available(c)]
    contenders = [c for c in contenders if available(c)]
    header = [
        f"{arguments.tasks:,} tasks drained per run, {arguments.runs} run(s) per contender, "
        f"medians; {arguments.round_trips} round trips per run",
        f"{_machine()}; {_versions()}; {time.strftime('%Y-%m-%d')}",
    ]
    if skipped:
        header.append(f"skipped (not installed: uv sync --group bench): {', '.join(skipped)}")
    for line in header:
        print(f"# {line}", flush=True)
    print("\n".join(table([], arguments.queue_type)), flush=True)
    not_run: list[str] = []
    rows = _run_rows(
        contenders,
        arguments.tasks,
        arguments.runs,
        arguments.round_trips,
        queue_type=arguments.queue_type,
        skipped=not_run,
    )
    leak_rows: list[Row] = []
    if arguments.leak_tasks:
        checked = [c for c in contenders if c.key in arguments.leak_only.split(",")]
        checked = [c for c in checked if c.key in {row.contender.key for row in rows}]
        print(f"\n# leak check: {arguments.leak_tasks:,} tasks, 1 run each", flush=True)
        print("\n".join(table([], arguments.queue_type)), flush=True)
        leak_rows = _run_rows(
            checked, arguments.leak_tasks, 1, 0, queue_type=arguments.queue_type, skipped=not_run
        )
    header += [f"skipped {reason}" for reason in not_run]
    out: Path | None = arguments.out or (None if arguments.smoke else REPO / "docs" / "bench")
    if out is None:
        return
    suffix = "" if arguments.queue_type == "classic" else f"-{arguments.queue_type}"
    out.mkdir(parents=True, exist_ok=True)
    raw = {
        "header": header,
        "queue_type": arguments.queue_type,
        "leak_tasks": arguments.leak_tasks,
        "rows": [_raw(row) for row in rows],
        "leak_rows": [_raw(row) for row in leak_rows],
    }
    (out / f"results{suffix}.json").write_text(json.dumps(raw, indent=1) + "\n")
    write_results(raw, out / f"results{suffix}.json")


def _raw(row: Row) -> dict[str, Any]:
    return {"key": row.contender.key, "runs": [dataclasses.asdict(run) for run in row.runs]}


def _rows(raw: list[dict[str, Any]]) -> list[Row]:
    by_key = {contender.key: contender for contender in CONTENDERS}
    unknown = sorted({row["key"] for row in raw} - set(by_key))
    if unknown:
        raise SystemExit(f"python -m bench: the results name unknown contenders: {unknown}")
    return [Row(by_key[row["key"]], [Run(**run) for run in row["runs"]]) for row in raw]


def write_results(raw: dict[str, Any], source: Path) -> None:
    """Write ``results*.md`` and the charts beside ``source`` from its raw figures."""
    rows, leak_rows = _rows(raw["rows"]), _rows(raw["leak_rows"])
    header: list[str] = raw["header"]
    lines = [*(f"- {line}" for line in header), "", *table(rows, raw["queue_type"])]
    if leak_rows:
        lines += ["", *leak_table(leak_rows, raw["leak_tasks"])]
    # results.json and results-quorum.json give the committed names; any other file name
    # becomes the suffix, so that its outputs sit beside it without overwriting those.
    suffix = source.stem.removeprefix("results") if source.stem.startswith("results") else ""
    suffix = suffix if source.stem.startswith("results") else f"-{source.stem}"
    (source.parent / f"results{suffix}.md").write_text("\n".join(lines) + "\n")
    try:
        from bench.charts import draw
    except ImportError:
        print("# matplotlib is not installed (uv sync --group bench): no charts", file=sys.stderr)
        return
    draw(rows, source.parent, suffix, f"{raw['queue_type']} queues; {header[1]}")


if __name__ == "__main__":
    main()
