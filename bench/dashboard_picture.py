"""A picture of the Grafana dashboard, drawn from its own queries on a real worker's metrics.

Grafana itself is not installed here; this draws the dashboard the honest way round::

    uv sync --locked --all-extras --group bench     # once: matplotlib
    apt-get install -y --no-install-recommends prometheus    # once: Debian's Prometheus
    uv run --group bench python -m bench.dashboard_picture    # about 3 minutes

1. A vhost of its own on the broker (``rabbitmqctl``; deleted at the end), whose queues are
   quorum queues, the platform's default (retries need their delivery count).
2. Two real workers, ``run examples.conformance_worker:worker`` (the pods ``worker-a`` and
   ``worker-b``, concurrency 4 each), each with its probes and metrics on a free port.
3. Debian's ``prometheus`` binary, run directly (never the system service) with a config and a
   data directory of its own in a temporary directory, scraping both ``/metrics`` every
   second as the job ``conformance``, with each target's ``pod`` label.
4. About two minutes of load through :class:`~async_task_api_worker.client.TaskClient`: a steady
   trickle, a burst, a stretch of failures, retries, progress floods and poison messages, a
   pause, a trickle again; then it waits for every task's terminal report.
5. For each panel of ``deploy/grafana/async-task-api-worker.json``, each target's own PromQL,
   with ``$job`` set to the run's job and ``$__rate_interval`` to ``--rate-interval``, asked
   of Prometheus's ``/api/v1/query_range`` over the run (step 1 s), and drawn in the
   dashboard's grid (``bench/dashboard_draw.py``) into ``--out``.

Everything it starts (the workers, Prometheus) is stopped on the way out, whatever happens.
``--ports LO-HI`` keeps its listening ports in a range (default: ports the kernel picks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from async_task_api_worker.client import TaskClient, build_envelope
from async_task_api_worker.protocol.reports import FailureReport, SuccessReport
from bench.dashboard import Panel, Series, load_panels, query_panels, query_range
from bench.measure import BROKER_URL, REPO, _vhost_url, rabbitmqctl

SERVICE = "conformance"
JOB = "conformance"
PODS = ("worker-a", "worker-b")
_TARGET = "examples.conformance_worker:worker"
_READY_TIMEOUT_S = 60.0
_REPORTS_TIMEOUT_S = 120.0
_SETTLED_BY_POD = f'sum by (pod) (worker_tasks_total{{job="{JOB}"}})'
_TAIL_S = 4.0  # after the last report: a few more scrapes, so the rates come back to 0
# Seeded: the same mix of tasks every time (the timings still vary).
_RANDOM = random.Random(32)  # noqa: S311 - a load mix, not a secret
Answers = dict[str, list[Series]]


def _ports(span: range | None, count: int) -> list[int]:
    """``count`` TCP ports free on 127.0.0.1 now: from ``span``, or the kernel's choice."""
    picked: list[int] = []
    candidates = _RANDOM.sample(span, len(span)) if span else [0] * count * 4
    for candidate in candidates:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            port = int(probe.getsockname()[1])
        if port not in picked:
            picked.append(port)
        if len(picked) == count:
            return picked
    raise RuntimeError(f"fewer than {count} free ports in {span}")


@contextlib.contextmanager
def _vhost() -> Iterator[str]:
    vhost = f"dashboard-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", vhost, "--default-queue-type", "quorum")  # the platform's
    user = urllib.parse.unquote(urllib.parse.urlsplit(BROKER_URL).username or "guest")
    rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
    try:
        yield vhost
    finally:
        rabbitmqctl("delete_vhost", vhost)


@contextlib.contextmanager
def _started(command: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[None]:
    """Run ``command`` (output to ``log``) for the block; SIGTERM, then SIGKILL after 30 s."""
    with log.open("wb") as sink:
        process = subprocess.Popen(  # noqa: S603 - our own command
            command, stdout=sink, stderr=subprocess.STDOUT, cwd=REPO, env=env
        )
    try:
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_http(url: str, what: str, log: Path) -> None:
    """Until ``url`` answers 200 (this is a script: it polls, bounded)."""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(url, timeout=2) as answer,  # noqa: S310 - local http
        ):
            if answer.status == 200:
                return
        time.sleep(0.25)
    tail = log.read_text(errors="replace").strip().splitlines()[-5:]
    raise RuntimeError(f"{what} not ready at {url} within {_READY_TIMEOUT_S:g} s: {tail}")


def _prometheus_config(targets: dict[str, int]) -> str:
    """A config scraping each pod's ``/metrics`` every second, as the job :data:`JOB`."""
    static = [
        {"targets": [f"127.0.0.1:{port}"], "labels": {"pod": pod}} for pod, port in targets.items()
    ]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": JOB, "static_configs": static}],
    }
    return json.dumps(config, indent=2)  # JSON is YAML


def _task(kind: str) -> dict[str, object]:
    """One task input for the conformance worker (docs/conformance.md, "The reference task")."""
    if kind == "fail":
        return {"behaviour": "fail", "code": _RANDOM.choice(["QUOTA_EXCEEDED", "UPSTREAM_DOWN"])}
    if kind == "retry":  # succeeds on its third attempt
        return {"behaviour": "retry", "code": "UPSTREAM_BUSY", "until_attempt": 3,
                "retry_delay_s": 0.5}  # fmt: skip
    if kind == "give-up":  # retries until the delivery limit, then fails with its code
        return {"behaviour": "retry", "code": "UPSTREAM_BUSY", "retry_delay_s": 0.2}
    if kind == "progress":  # eight updates in 0.8 s: the 1 s throttle drops the superseded
        fractions = [0.1, 0.2, 0.3, 0.4, 0.35, 0.6, 0.7, 0.8]
        return {"behaviour": "progress", "fractions": fractions, "interval_s": 0.1}
    return {"behaviour": "sleep", "seconds": round(_RANDOM.uniform(0.05, 0.5), 3)}


# The load: (phase, seconds, tasks per second, mix of kinds, poison messages per second).
PHASES = (
    ("steady", 25, 6, {"ok": 9, "progress": 1}, 0),
    ("burst", 1, 500, {"ok": 1}, 0),
    ("failures", 30, 8, {"ok": 3, "fail": 3, "retry": 2, "give-up": 1, "progress": 1}, 1),
    ("pause", 25, 0, {}, 0),
    ("steady", 20, 6, {"ok": 9, "progress": 1}, 0),
)


async def _poison(client: TaskClient, *, wrong_version: bool) -> str:
    """Publish an envelope the worker refuses (another service's, or protocol version 99).

    It carries a task id, so its ``failure POISON_MESSAGE`` report is this client's to read.
    """
    task_id, body = build_envelope({"behaviour": "succeed"}, service="another-service")
    if wrong_version:
        envelope = json.loads(body) | {"service": SERVICE, "protocol_version": 99}
        body = json.dumps(envelope).encode()
    client.watch(task_id)
    await client.publish_raw(body)
    return task_id


async def _load(url: str) -> Counter[str]:
    """Submit :data:`PHASES`; then wait for every terminal report. Outcomes by code."""
    client = TaskClient(url=url, service=SERVICE, client_id="dashboard-picture")
    await client.connect()
    ids: list[str] = []
    try:
        for phase, seconds, rate, mix, poison in PHASES:
            print(f"  {phase}: {seconds} s, {rate} tasks/s, poison {poison}/s", flush=True)
            kinds, weights = list(mix), list(mix.values())
            for second in range(seconds):
                began = time.monotonic()
                for _ in range(rate):
                    ids.append(await client.submit(_task(_RANDOM.choices(kinds, weights)[0])))
                for index in range(poison):
                    ids.append(await _poison(client, wrong_version=(second + index) % 2 == 1))
                await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
        outcomes: Counter[str] = Counter()

        async def conclude(task_id: str) -> None:
            async for report in client.reports(task_id):
                if isinstance(report, SuccessReport):
                    outcomes["success"] += 1
                elif isinstance(report, FailureReport):
                    outcomes[f"failure {report.error.code}"] += 1

        await asyncio.wait_for(
            asyncio.gather(*(conclude(task_id) for task_id in ids)), _REPORTS_TIMEOUT_S
        )
        return outcomes
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    """Run the workers, Prometheus and the load (or read ``--replot``); draw.

    Returns:
        The exit code: 0, or 2 when there is no ``prometheus`` on ``PATH``.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "assets" / "dashboard.png")
    parser.add_argument("--ports", help="LO-HI: listen on ports in this range only")
    parser.add_argument("--rate-interval", default="10s", help="$__rate_interval (default 10s)")
    parser.add_argument("--dpi", type=int, default=80)
    parser.add_argument("--save-series", type=Path, help="also write the series (JSON) here")
    parser.add_argument("--replot", type=Path, help="draw the series of a --save-series file")
    arguments = parser.parse_args(argv)
    from bench.dashboard_draw import draw  # matplotlib: the bench group

    panels = load_panels()  # first: a dashboard this cannot read fails before anything starts
    if arguments.replot:
        saved = json.loads(arguments.replot.read_text())
        caption = saved["caption"]
        series = {
            title: [Series(**one) for one in found] for title, found in saved["series"].items()
        }
    else:
        if shutil.which("prometheus") is None:
            print("no prometheus on PATH: apt-get install prometheus", file=sys.stderr)
            return 2
        span = None
        if arguments.ports:
            low, high = (int(part) for part in arguments.ports.split("-"))
            span = range(low, high + 1)
        series, minutes = _run(panels, span, arguments.rate_interval)
        caption = textwrap.fill(
            f"Drawn with matplotlib from the dashboard's own PromQL, asked of "
            f"{_prometheus_version()} (scrape 1 s, $__rate_interval = {arguments.rate_interval}, "
            f"job = {JOB}) over {minutes:.1f} minutes of two real workers "
            f"(examples/conformance_worker.py) under load: not a Grafana screenshot. "
            f"Regenerate: uv run --group bench python -m bench.dashboard_picture",
            150,
        )
    if arguments.save_series:
        found = {title: [vars(one) for one in each] for title, each in series.items()}
        arguments.save_series.write_text(json.dumps({"caption": caption, "series": found}))
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    drawn = draw(panels, series, arguments.out, title="async-task-api-worker", caption=caption,
                 dpi=arguments.dpi)  # fmt: skip
    shown = arguments.out.resolve()
    shown = shown.relative_to(REPO) if shown.is_relative_to(REPO) else shown
    print(f"{len(drawn)} panels drawn into {shown} ({arguments.out.stat().st_size} bytes)")
    return 0


def _run(panels: list[Panel], span: range | None, rate_interval: str) -> tuple[Answers, float]:
    """The steps 1 to 5 of the module's doc: each panel's series, and the minutes they span."""
    *worker_ports, prometheus_port = _ports(span, len(PODS) + 1)
    prometheus = f"http://127.0.0.1:{prometheus_port}"
    with tempfile.TemporaryDirectory(prefix="dashboard-picture-") as scratch, _vhost() as vhost:
        root, url = Path(scratch), _vhost_url(vhost)
        with contextlib.ExitStack() as running:
            for pod, port in zip(PODS, worker_ports, strict=True):
                env = {
                    **_worker_env(),
                    "BROKER_URL": url,
                    "HEALTH_CHECK_HOST": "127.0.0.1",
                    "HEALTH_CHECK_PORT": str(port),
                    "WORKER_CONCURRENCY": "4",
                    "WORKER_RETRY_BACKOFF_S": "0.2",
                    "WORKER_RETRY_BACKOFF_MAX_S": "1",
                    "LOG_LEVEL": "WARNING",
                }
                command = [sys.executable, "-m", "async_task_api_worker", "run", _TARGET]
                running.enter_context(_started(command, root / f"{pod}.log", env))
            for pod, port in zip(PODS, worker_ports, strict=True):
                _wait_http(f"http://127.0.0.1:{port}/ready", pod, root / f"{pod}.log")
            (root / "prometheus.yml").write_text(
                _prometheus_config(dict(zip(PODS, worker_ports, strict=True)))
            )
            running.enter_context(
                _started(
                    [
                        "prometheus",
                        f"--config.file={root / 'prometheus.yml'}",
                        f"--storage.tsdb.path={root / 'data'}",
                        f"--web.listen-address=127.0.0.1:{prometheus_port}",
                        "--log.level=warn",
                    ],
                    root / "prometheus.log",
                )
            )
            _wait_http(f"{prometheus}/-/ready", "prometheus", root / "prometheus.log")
            time.sleep(3)  # three scrapes before the first task: every rate starts from 0
            start = time.time()
            print(f"load on {vhost} (workers on {worker_ports}, prometheus {prometheus})")
            outcomes = asyncio.run(_load(url))
            time.sleep(_TAIL_S)
            end = time.time()
            print(f"{sum(outcomes.values())} tasks: {dict(sorted(outcomes.items()))}")
            for one in query_range(prometheus, _SETTLED_BY_POD, end, end, 1.0):
                print(f"  {one['metric'].get('pod')}: settled {float(one['values'][-1][1]):.0f}")
            variables = {"job": JOB, "__rate_interval": rate_interval}
            series = query_panels(
                panels,
                variables,
                lambda query: query_range(prometheus, query, start - 5, end, 1.0),
            )
    return series, (end - start + 5) / 60


def _worker_env() -> dict[str, str]:
    """This environment less the ``WORKER_*`` settings (the run sets its own)."""
    return {key: value for key, value in os.environ.items() if not key.startswith("WORKER_")}


def _prometheus_version() -> str:
    done = subprocess.run(
        ["prometheus", "--version"],  # noqa: S607 - Debian's binary on PATH
        capture_output=True,
        text=True,
        check=False,
    )
    words = (done.stdout or done.stderr).split()
    return f"Prometheus {words[2]}" if len(words) > 2 else "Prometheus"


if __name__ == "__main__":
    sys.exit(main())
