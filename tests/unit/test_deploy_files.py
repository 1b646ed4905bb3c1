"""The operations files under deploy/ speak of metrics and settings that really exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import generate_latest

from worker.metrics import REGISTRY
from worker.settings import Settings
from worker.shutdown import WATCHDOG_GRACE_S

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRIC = re.compile(r"\bsgw_[a-z_]+")


def exposed_names() -> set[str]:
    text = generate_latest(REGISTRY).decode()
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    # Counters are exposed with _total, histograms with _bucket/_sum/_count.
    return names | {n + s for n in names for s in ("_total", "_bucket", "_sum", "_count")}


def test_alert_rules_use_only_exposed_metrics() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    used = {name for expr in exprs for name in METRIC.findall(expr)}
    assert used and used <= exposed_names(), used - exposed_names()
    assert all(rule.get("annotations", {}).get("summary") for group in rules["groups"] for rule in group["rules"])


def test_dashboard_uses_only_exposed_metrics() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "scorer-group-worker.json").read_text())
    used = {name for panel in dashboard["panels"] for t in panel["targets"] for name in METRIC.findall(t["expr"])}
    assert used and used <= exposed_names(), used - exposed_names()
    # Every metric family the worker exposes is on the dashboard (or its alert rules).
    families = {n for n in exposed_names() if not n.endswith(("_total", "_bucket", "_sum", "_count", "_created"))}
    rules_text = (DEPLOY / "prometheus" / "rules.yml").read_text()
    shown = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in used | set(METRIC.findall(rules_text))}
    assert families <= shown, families - shown


def test_kubernetes_manifest_sets_only_real_settings() -> None:
    manifest = yaml.safe_load((DEPLOY / "kubernetes" / "worker.yaml").read_text())
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    names = {e["name"] for e in container["env"]}
    known = {f"SGW_{field.upper()}" for field in Settings.model_fields}
    assert names <= known, names - known
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    grace = manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    shutdown = next(float(e["value"]) for e in container["env"] if e["name"] == "SGW_SHUTDOWN_TIMEOUT_S")
    assert grace > 2 * shutdown + WATCHDOG_GRACE_S, "Kubernetes must wait longer than the worker's own watchdog"
