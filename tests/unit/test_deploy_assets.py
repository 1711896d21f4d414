"""The files in deploy/: the dashboard, the alert rules and the Deployment stay true to the code."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from async_task_api_worker.observability.metrics import WorkerMetrics
from async_task_api_worker.runtime.hooks import shutdown_bound_s
from async_task_api_worker.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "async-task-api-worker.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
DEPLOYMENT = DEPLOY / "kubernetes" / "deployment.yaml"

SEED_METRICS = (
    "worker_tasks_total",
    "worker_task_duration_seconds",
    "worker_messages_published_total",
    "event_loop_lag_seconds",
    "worker_task_failures_total",
    "worker_task_retries_total",
    "worker_poison_messages_total",
    "worker_publish_failures_total",
    "worker_ack_failures_total",
    "worker_tasks_in_flight",
    "worker_shutdown_requeued_total",
    "worker_progress_dropped_total",
    "worker_sdk_info",
)
# Series names of our registry, and names PromQL may use besides them.
_OURS = re.compile(r"\b((?:worker|event_loop|process|python)_[a-z_]+)\b")
_PROMQL_WORDS = {"worker_sdk_info"}


def served_names() -> set[str]:
    names = set()
    for family in WorkerMetrics().registry.collect():
        names.update(sample.name for sample in family.samples)
    return names


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_dashboard_queries_only_metrics_that_exist_and_all_of_the_seeds() -> None:
    exprs = dashboard_exprs()
    queried = {name for expr in exprs for name in _OURS.findall(expr)}
    assert queried <= served_names() | _PROMQL_WORDS, queried - served_names()
    text = "\n".join(exprs)
    for name in SEED_METRICS:
        assert name in text, f"no panel shows {name}"


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    assert set(document) == {"groups"}
    rules: list[dict[str, Any]] = []
    for group in document["groups"]:
        assert set(group) == {"name", "rules"}
        rules.extend(group["rules"])
    return rules


def test_the_alert_rules_have_the_required_shape_and_cover_the_issue() -> None:
    rules = alert_rules()
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert isinstance(rule["alert"], str) and isinstance(rule["expr"], str)
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert {"summary", "description"} <= set(rule["annotations"])
        if "for" in rule:
            assert re.fullmatch(r"[0-9]+[smh]", rule["for"])
        worker_names = set(_OURS.findall(rule["expr"]))
        assert worker_names <= served_names(), worker_names - served_names()
    names = {rule["alert"] for rule in rules}
    assert {
        "WorkerNoConsumer",
        "WorkerPoisonMessages",
        "WorkerPublishFailures",
        "WorkerEventLoopLag",
        "WorkerCrashLoopAbandons",
    } <= names


promtool = shutil.which("promtool")


@pytest.mark.skipif(promtool is None, reason="promtool is not installed (the shape test runs)")
def test_promtool_accepts_the_rules_and_the_dashboard_queries(tmp_path: Path) -> None:
    assert promtool is not None
    done = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The dashboard's queries, as recording rules: promtool parses every one of them.
    recorded = [
        {
            "record": f"dashboard:query_{number}",
            "expr": expr.replace("$__rate_interval", "5m").replace("$job", ".+"),
        }
        for number, expr in enumerate(dashboard_exprs())
    ]
    rules = tmp_path / "dashboard.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    done = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_deployment_probes_and_grace_period_follow_the_settings() -> None:
    deployment = yaml.safe_load(DEPLOYMENT.read_text())
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    port = int(env["HEALTH_CHECK_PORT"])
    assert container["ports"] == [{"name": "probes", "containerPort": port}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "probes"}
    assert container["startupProbe"]["httpGet"] == {"path": "/health", "port": "probes"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "probes"}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)
    settings = load_settings(
        {"worker_shutdown_grace_s": float(env["WORKER_SHUTDOWN_GRACE_S"])},
        read_environment=False,
    )
    assert pod["terminationGracePeriodSeconds"] >= shutdown_bound_s(settings)


def test_the_deployment_guide_shows_the_deployment_file() -> None:
    guide = (ROOT / "docs" / "deployment.md").read_text()
    assert f"```yaml\n{DEPLOYMENT.read_text()}```" in guide


SCALED_OBJECT = DEPLOY / "kubernetes" / "scaledobject.yaml"


def test_the_scaled_object_scales_the_deployment_on_its_input_queue_length() -> None:
    authentication, scaled = yaml.safe_load_all(SCALED_OBJECT.read_text())
    deployment = yaml.safe_load(DEPLOYMENT.read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item for item in container["env"]}
    assert (authentication["kind"], scaled["kind"]) == ("TriggerAuthentication", "ScaledObject")
    assert {a["apiVersion"] for a in (authentication, scaled)} == {"keda.sh/v1alpha1"}
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "rabbitmq"
    assert trigger["metadata"]["queueName"] == env["IN_QUEUE_NAME"]["value"]
    assert trigger["metadata"]["mode"] == "QueueLength"
    assert int(trigger["metadata"]["value"]) >= int(env["WORKER_CONCURRENCY"]["value"])
    assert trigger["authenticationRef"]["name"] == authentication["metadata"]["name"]
    # The trigger's connection string is the worker's own BROKER_URL, from the same secret.
    (secret,) = authentication["spec"]["secretTargetRef"]
    assert secret["parameter"] == "host"
    assert {"name": secret["name"], "key": secret["key"]} == env["BROKER_URL"]["valueFrom"][
        "secretKeyRef"
    ]
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]


def test_the_operations_page_lists_every_panel_and_alert_and_shows_the_scaled_object() -> None:
    page = (ROOT / "docs" / "operations.md").read_text()
    dashboard = json.loads(DASHBOARD.read_text())
    assert [panel["title"] for panel in dashboard["panels"]] == re.findall(
        r"^\| ([^|`]+?) \| `", page[page.index("## The dashboard") :], flags=re.M
    )[: len(dashboard["panels"])]
    rules = yaml.safe_load(ALERTS.read_text())
    alerts = [
        (rule["alert"], rule["annotations"]["summary"])
        for group in rules["groups"]
        for rule in group["rules"]
    ]
    # The summary as the table shows it: a pipe in a cell is escaped (``\|``), or it splits it.
    shown = re.findall(r"^\| `(Worker\w+)` \| ((?:[^|\\]|\\\|)+) \|$", page, flags=re.M)
    assert alerts == [(name, says.replace("\\|", "|")) for name, says in shown]
    # Every variable of the dashboard is named on the page, and the import's questions are right.
    section = page[page.index("## The dashboard") :]
    for variable in dashboard["templating"]["list"]:
        assert f"- `{variable['name']}`:" in section, variable["name"]
    assert ("__inputs" in dashboard) == ("has no `__inputs`" not in section)
    assert '--8<-- "deploy/kubernetes/scaledobject.yaml"' in page
