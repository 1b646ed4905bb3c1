"""The Helm chart (deploy/helm/scorer-group-worker) renders with ``helm template`` - the default
values, a secured-Kafka values file, and everything switched on - into objects that validate
against the Kubernetes schemas (kubernetes-validate's, shipped in its package: offline), use only
settings that exist, probe /readyz and /healthz, and give the worker a grace period longer than
its own shutdown watchdog. Helm is built once by devtools/bootstrap.sh (``go install``, pinned)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from worker.settings import Settings
from worker.shutdown import WATCHDOG_GRACE_S

ROOT = Path(__file__).resolve().parents[2]
HELM = ROOT / ".tools" / "helm"
CHART = ROOT / "deploy" / "helm" / "scorer-group-worker"
KUBERNETES = "1.33"
EVERYTHING = ["--set", "autoscaling.keda.enabled=true", "--set", "secrets.SGW_REDIS_URL=redis://redis:6379/0",
              "--set", "secrets.SGW_JUDGE_API_KEY=sk-example", "--set", "tlsSecret=sgw-tls",
              "--set-json", 'catalog={"judges": [{"id": "help", "name": "Helpful", "criteria": "Helpful?"}]}']


def render(*args: str) -> list[dict[str, Any]]:
    assert HELM.is_file(), "run devtools/bootstrap.sh (./dev test does): it builds helm into .tools/"
    done = subprocess.run([str(HELM), "template", "sgw", str(CHART), *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


CASES = {"default": [], "secured-kafka": ["-f", str(CHART / "values-secured-kafka.yaml")], "everything": EVERYTHING}


@pytest.fixture(scope="module", params=list(CASES))
def objects(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(*CASES[request.param])


def containers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    pods = [o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "Job")]
    return [c for pod in pods for c in pod["containers"]]


def test_every_object_validates_against_the_kubernetes_schemas(objects: list[dict[str, Any]]) -> None:
    for item in objects:
        if item["apiVersion"].startswith("keda.sh/"):  # a CRD: its own fields, checked below
            assert item["spec"]["scaleTargetRef"]["name"] in {o["metadata"]["name"] for o in objects}
            continue
        kubernetes_validate.validate(item, KUBERNETES, strict=True)


def test_only_settings_that_exist(objects: list[dict[str, Any]]) -> None:
    names = {f"SGW_{field.upper()}" for field in Settings.model_fields}
    used = {e["name"] for c in containers(objects) for e in c.get("env", [])}
    used |= {k for o in objects if o["kind"] == "Secret" for k in o.get("stringData", {})}
    assert used and used <= names, sorted(used - names)


def test_probes_and_a_grace_period_longer_than_the_workers_shutdown(objects: list[dict[str, Any]]) -> None:
    worker = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-worker"))
    pod = worker["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    shutdown = float(next(e["value"] for e in container["env"] if e["name"] == "SGW_SHUTDOWN_TIMEOUT_S"))
    assert pod["terminationGracePeriodSeconds"] > 2 * shutdown + WATCHDOG_GRACE_S
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    api = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-api")]
    service = [o for o in objects if o["kind"] == "Service"]
    assert len(api) == 1 and len(service) == 1, "the API the console, the SDK and keys need"
    labels = api[0]["spec"]["template"]["metadata"]["labels"]
    assert service[0]["spec"]["selector"].items() <= labels.items()


def test_secrets_are_referenced_never_inlined_as_plain_env(objects: list[dict[str, Any]]) -> None:
    secret_like = {"SGW_REDIS_URL", "SGW_JUDGE_API_KEY", "SGW_KAFKA_SASL_PASSWORD", "SGW_JUDGE_EXTRA_HEADERS"}
    for container in containers(objects):
        assert not secret_like & {e["name"] for e in container.get("env", [])}, container["name"]


def test_the_secured_values_connect_with_sasl_ssl_and_need_no_admin_rights() -> None:
    objects = render(*CASES["secured-kafka"])
    (worker,) = [c for c in containers(objects) if c["name"] == "worker"]
    env = {e["name"]: e["value"] for e in worker["env"]}
    assert env["SGW_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL" and env["SGW_CREATE_TOPICS"] == "false"
    assert worker["envFrom"] == [{"secretRef": {"name": "scorer-group-worker-secrets"}}]
    assert worker["volumeMounts"] == [{"name": "tls", "mountPath": "/etc/scorer-group-worker/tls", "readOnly": True}]


def test_the_schemas_would_refuse_a_mistake() -> None:
    worker = next(o for o in render() if o["kind"] == "Deployment")
    worker["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 30  # a typo: no such field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(worker, KUBERNETES, strict=True)
