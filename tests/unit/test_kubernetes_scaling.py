"""The autoscaling and disruption manifests under deploy/kubernetes fit the worker's Deployment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from worker.settings import Settings

KUBERNETES = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def load(name: str) -> Any:
    return yaml.safe_load((KUBERNETES / name).read_text())


def deployment_env() -> dict[str, str]:
    container = load("worker.yaml")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def setting(name: str) -> str:
    """The Deployment's value of SGW_<NAME>, else the worker's default."""
    return deployment_env().get(f"SGW_{name.upper()}") or str(Settings.model_fields[name].default)


def test_keda_scales_the_deployment_on_the_lag_of_the_workers_own_group_and_topic() -> None:
    scaled, deployment = load("autoscaling.yaml"), load("worker.yaml")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["kind"] == "ScaledObject"
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    [trigger] = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "kafka"
    assert meta["consumerGroup"] == setting("consumer_group")
    assert meta["topic"] == setting("traces_topic")
    assert meta["bootstrapServers"] == setting("kafka_bootstrap")
    assert int(meta["lagThreshold"]) > 0
    assert meta["allowIdleConsumers"] == "false"


def test_keda_never_scales_past_the_partitions_nor_to_zero() -> None:
    spec = load("autoscaling.yaml")["spec"]
    assert spec["maxReplicaCount"] <= int(setting("topic_partitions")), "a worker past the partitions idles"
    assert spec["minReplicaCount"] >= 2, "one pod's restart must not stop grading"
    down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": down["policies"][0]["periodSeconds"]}]


def test_the_disruption_budget_covers_the_workers_pods_one_at_a_time() -> None:
    budget, deployment = load("disruption-budget.yaml"), load("worker.yaml")
    assert budget["apiVersion"] == "policy/v1" and budget["kind"] == "PodDisruptionBudget"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert budget["spec"]["maxUnavailable"] == 1
    assert load("autoscaling.yaml")["spec"]["minReplicaCount"] > budget["spec"]["maxUnavailable"]
