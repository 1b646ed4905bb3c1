"""The dashboard and the alert rules, proven on a real Prometheus scraping a real worker.

Debian's ``prometheus`` (with ``promtool``; devtools/bootstrap.sh installs it) runs on a free
loopback port with its storage in the test's temporary folder, scraping every second a worker
and an API process on the real broker and Redis, with the alert rules of deploy/prometheus
loaded. The traffic is chosen so that every panel has something to show: traces rated and
below threshold (Signals, webhook deliveries), a gated judge that errors (no_score, member
failures), a project over its judge budget, malformed records (dead letters), OTLP spans (one
trace over the span bound), alert channels that succeed, fail (breaker opens) and answer 410
(disabled), and API requests. Then:

- every PromQL expression of the Grafana dashboard parses and returns at least one series with
  a value (no dead panel);
- every alert expression parses, each series selector in it has series (a rule never watches
  a metric or label that does not exist), and Prometheus evaluates every rule without error;
- ``promtool check metrics`` accepts what the worker and the API expose.

``promtool check rules`` and ``promtool test rules`` (deploy/prometheus/rules.test.yml: each
alert firing and not firing) need no services and run as their own tests.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from devtools.judge_server import Behaviour, JudgeServer
from devtools.processes import free_port
from tests.support.api_process import ApiProcess
from tests.support.harness import WorkerProcess, catalog_db, produce, read_topic, worker_env
from tests.support.http_fakes import Reply, ScriptedServer
from tests.support.otlp_records import Telemetry, records, span

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "rules.test.yml"
DASHBOARD = DEPLOY / "grafana" / "scorer-group-worker.json"
JOB = "scorer-group-worker"  # the job name the rules' `up{job=...}` expects
METRIC_NAME = re.compile(r"\bsgw_[a-z_]+")
SELECTOR = re.compile(r'\b((?:sgw_[a-z_]+|up(?=\{))(?:\{[^}]*\})?)')
PROMETHEUS_START_TIMEOUT_S = 30
DATA_TIMEOUT_S = 90
WAVES, WAVE_PAUSE_S = 3, 3.0
# What the traffic makes happen: panels over these metrics must show more than 0.
HAPPENED = {"sgw_webhook_channels_disabled_total", "sgw_groups_skipped_total", "sgw_otlp_dropped_spans_total",
            "sgw_traces_dead_lettered_total", "sgw_signals_raised_total", "sgw_member_failures_total",
            "sgw_judge_calls_total", "sgw_webhook_deliveries_total", "sgw_traces_filtered_total"}
# Alerts about what this test keeps healthy (with the API process scraped too, as the dashboard's
# API panels need): their expressions must have no result.
SILENT_UNDER_TRAFFIC = {"ScorerWorkerNotReady", "ScorerWorkerCommitsStalled", "ScorerDependencyUnreachable",
                        "ScorerCatalogLost", "ScorerCodeSandboxUnavailable", "ScorerOtlpAssemblySlow",
                        "ScorerWebhookDeliveriesStuck", "ScorerHotPathInterpreted"}
# Alerts this traffic must make true: their expressions must have a result, not only parse.
TRUE_UNDER_TRAFFIC = {"ScorerJudgeBudgetExhausted", "ScorerOtlpSpansDropped", "ScorerWebhookChannelDisabled"}

AGENT = "agent-prom"
ONLINE = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 5, "severity": "high"}


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} not found: run devtools/bootstrap.sh (installs Debian's prometheus package)"
    return path


def dashboard_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


# --- Static checks with promtool -----------------------------------------------------------------

def test_promtool_checks_the_alert_rules() -> None:
    done = subprocess.run([tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout, done.stdout


def test_promtool_unit_tests_cover_each_alert_firing_and_not() -> None:
    done = subprocess.run([tool("promtool"), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                          timeout=120, cwd=RULE_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    # Each alert has a case where it fires (exp_alerts with an entry) and one where it does not.
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fires: set[str] = set()
    silent: set[str] = set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names <= fires, f"alerts never shown firing: {sorted(names - fires)}"
    assert names <= silent, f"alerts never shown silent: {sorted(names - silent)}"


def test_every_alert_has_a_runbook_entry_in_the_docs() -> None:
    runbook = (DEPLOY.parent / "docs" / "operate" / "runbook.md").read_text()
    entries = re.findall(r"^## `(\w+)`", runbook, re.MULTILINE)
    assert sorted(entries) == sorted({rule["alert"] for rule in alert_rules()})
    for entry in runbook.split("\n## ")[1:]:
        assert all(f"- {part}:" in entry for part in ("Means", "Check", "Do")), entry[:80]


# --- The live check ------------------------------------------------------------------------------

class Prometheus:
    """A real Prometheus on 127.0.0.1, storage under ``folder``, stopped by ``stop``."""

    def __init__(self, folder: Path, targets: dict[str, str]) -> None:
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}
                               for job, target in targets.items()],
        }
        self.config = folder / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Prometheus:
        self.proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={self.config}", f"--storage.tsdb.path={self.folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=open(self.folder / "prometheus.log", "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + PROMETHEUS_START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited:\n{self.logs()}"
            try:
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready in {PROMETHEUS_START_TIMEOUT_S}s:\n{self.logs()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def logs(self) -> str:
        path = self.folder / "prometheus.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def query(self, expr: str) -> dict[str, Any]:
        """The API's whole answer: status "success" with data, or "error" with the parse error."""
        return httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10).json()  # type: ignore[no-any-return]

    def wait_scraped(self, *jobs: str) -> None:
        """Until every job's target has been scraped (up == 1): discovery starts them a few
        seconds after Prometheus is ready."""
        deadline = time.monotonic() + PROMETHEUS_START_TIMEOUT_S
        while time.monotonic() < deadline:
            up = {s["metric"]["job"] for s in self.query("up == 1")["data"]["result"]}
            if up >= set(jobs):
                return
            time.sleep(0.2)
        raise AssertionError(f"targets {jobs} not scraped in {PROMETHEUS_START_TIMEOUT_S}s:\n{self.logs()}")

    def rules(self) -> list[dict[str, Any]]:
        groups = httpx.get(self.url + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]


def has_values(answer: dict[str, Any], positive: bool = False) -> bool:
    """At least one series with a number (not NaN; above 0 if ``positive``): a panel that draws."""
    if answer.get("status") != "success":
        return False
    result = answer["data"]["result"]
    values = [float(sample["value"][1]) for sample in result] if answer["data"]["resultType"] == "vector" else []
    return any(not math.isnan(v) and (v > 0 or not positive) for v in values)


def api_requests(url: str) -> None:
    with httpx.Client(base_url=url, timeout=10) as client:
        for path in ("/healthz", "/v1/groups", "/v1/groups/live", "/openapi.json"):
            client.get(path)


def promtool_check_metrics(url: str) -> tuple[bool, str]:
    text = httpx.get(url + "/metrics", timeout=10).text
    done = subprocess.run([tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60)
    return done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def prometheus_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "prometheus"
    folder.mkdir()
    return folder


@pytest.fixture
def judge() -> Iterator[JudgeServer]:
    with JudgeServer(default_rating=6) as server:
        yield server


@pytest.fixture
def receivers() -> Iterator[dict[str, ScriptedServer]]:
    with ScriptedServer(default=Reply(body={"ok": True})) as ok, \
            ScriptedServer(default=Reply(status=500, body={"error": "down"})) as failing, \
            ScriptedServer(default=Reply(status=410, body={"error": "gone"})) as gone:
        yield {"ok": ok, "failing": failing, "gone": gone}


def catalog(receivers: dict[str, ScriptedServer]) -> dict[str, Any]:
    return {
        "judges": [{"id": "quality", "name": "Quality", "criteria": "Helpful?"}],
        "patterns": [{"id": "apology", "name": "Apology", "polarity": "failure", "template": "apology"}],
        "groups": [
            {"id": "live", "name": "Live quality", "projectId": "p-prom", "online": ONLINE,
             "members": [{"kind": "judge", "refId": "quality", "weight": 1, "gate": True},
                         {"kind": "pattern", "refId": "apology", "weight": 1, "gate": False}]},
            {"id": "budgeted", "name": "Budgeted", "projectId": "p-budget", "online": ONLINE,
             "members": [{"kind": "judge", "refId": "quality", "weight": 1, "gate": False}]},
            # Aimed at an agent the traffic never comes from: every trace of its project filtered out.
            {"id": "aimed", "name": "Aimed elsewhere", "projectId": "p-prom",
             # ... and alerting on windows: the incident panel has a watch to show (0: none open).
             "online": {**ONLINE, "filter": {"field": "agentId", "op": "eq", "value": "another-agent"},
                        "alertMode": "window"},
             "members": [{"kind": "pattern", "refId": "apology", "weight": 1, "gate": False}]},
        ],
        "budgets": [{"projectId": "p-budget", "judgeCallsPerWindow": 2, "windowSeconds": 3600}],
        "channels": [{"agentId": AGENT, "url": server.url + "/hook"} for server in receivers.values()],
    }


def trace(trace_id: str, project: str, output: str) -> tuple[bytes, bytes]:
    return trace_id.encode(), orjson.dumps({
        "traceId": trace_id, "projectId": project, "agentId": AGENT, "timestamp": "2026-12-02T13:00:00Z",
        "spans": [{"spanId": "r", "input": "q", "output": output}]})


def otlp_traces() -> list[tuple[bytes | None, bytes]]:
    """A small GenAI trace, and one of 6 spans over a bound of 4 (spans dropped)."""
    small, big = Telemetry(**{"service.name": "bot", "sgw.project.id": "p-prom"}), \
        Telemetry(**{"service.name": "bot", "sgw.project.id": "p-prom"})
    with span(small.tracer, "invoke_agent Helper", **{"gen_ai.operation.name": "invoke_agent"}):
        with span(small.tracer, "chat", **{"gen_ai.operation.name": "chat"}):
            pass
    with span(big.tracer, "invoke_agent Helper", **{"gen_ai.operation.name": "invoke_agent"}):
        for i in range(5):
            with span(big.tracer, f"chat {i}", **{"gen_ai.operation.name": "chat"}):
                pass
    return [(k, v) for k, v in records(small.spans()) + records(big.spans())]


async def test_every_panel_and_alert_expression_works_on_a_real_prometheus(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path, prometheus_folder: Path,
        judge: JudgeServer, receivers: dict[str, ScriptedServer]) -> None:
    async with catalog_db(redis_db_url, catalog(receivers)) as url:
        env = worker_env(kafka_bootstrap, url, f"prom-{unique}", judge_base_url=judge.base_url,
                         egress_allow="127.0.0.0/8", webhook_retry_schedule="200ms,200ms",
                         webhook_breaker_failures=2, webhook_breaker_open_s=600,
                         otlp_enabled="true", otlp_topic=f"otlp-{unique}", otlp_quiet_s=0.5,
                         otlp_max_wait_s=3, otlp_flush_interval_s=0.2, otlp_max_spans_per_trace=4,
                         commit_interval_s=0.2)
        worker = WorkerProcess(env).start(tmp_path)
        api = ApiProcess(url, tmp_path / "api.log")
        prometheus: Prometheus | None = None
        try:
            worker.wait_ready()
            api.start()
            prometheus = Prometheus(prometheus_folder, {JOB: f"127.0.0.1:{worker.metrics_port}",
                                                        f"{JOB}-api": f"127.0.0.1:{api.port}"})
            prometheus.start()  # assigned first: stopped in `finally` even if it never gets ready
            prometheus.wait_scraped(JOB, f"{JOB}-api")

            # Traffic, in waves a few scrapes apart (rates see increases, not counters that were
            # born at their final value): one judge call per wave fails (a gated judge: no score),
            # then ratings of 2 and 6; apologies; a project over its budget; malformed records;
            # OTLP spans; API requests.
            for wave in range(WAVES):
                judge.script(Behaviour.status(400))
                # Each answer its own (the trace id in it): the same answer twice is one judge call
                # (the verdict cache), and these waves are to make calls.
                live = [trace(f"l-{wave}-{i}", "p-prom", f"[[rating={2 if i % 2 else 6}]] {'sorry' if i % 3 else 'ok'}"
                              f" l-{wave}-{i}") for i in range(10)]
                budgeted = [trace(f"b-{wave}-{i}", "p-budget", f"[[rating=7]] fine b-{wave}-{i}") for i in range(3)]
                malformed = [(f"bad-{wave}".encode(), b"not json")]
                await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], live + budgeted + malformed)
                await produce(kafka_bootstrap, env["SGW_OTLP_TOPIC"], otlp_traces())
                api_requests(api.url)
                await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], timeout_s=90,
                                 until=lambda v, w=wave: {f"l-{w}-{i}" for i in range(10)} <= {r["traceId"] for r in v})
                await asyncio.sleep(WAVE_PAUSE_S)

            # Every panel draws something; a panel of what the traffic made happen shows it (> 0).
            dead = {expr: title for title, expr in dashboard_exprs()}
            parse_errors: dict[str, str] = {}
            deadline = time.monotonic() + DATA_TIMEOUT_S
            while dead and time.monotonic() < deadline:
                for expr in list(dead):
                    answer = prometheus.query(expr)
                    if answer.get("status") == "error":
                        parse_errors[expr] = answer.get("error", "")
                        dead.pop(expr)
                    elif has_values(answer, positive=bool(HAPPENED & set(METRIC_NAME.findall(expr)))):
                        dead.pop(expr)
                if dead:
                    await asyncio.sleep(1)
            assert not parse_errors, f"dashboard expressions Prometheus refuses: {parse_errors}"
            assert not dead, f"dead panels (no data after {DATA_TIMEOUT_S}s of traffic): {dead}"

            # Every alert expression parses and watches series that exist; every rule evaluates.
            missing: dict[str, list[str]] = {}
            for rule in alert_rules():
                answer = prometheus.query(rule["expr"])
                assert answer.get("status") == "success", (rule["alert"], answer)
                for selector in set(SELECTOR.findall(rule["expr"])):
                    if not prometheus.query(f"count({selector})")["data"]["result"]:
                        missing.setdefault(rule["alert"], []).append(selector)
            assert not missing, f"alert expressions watching series that do not exist: {missing}"
            silent = [rule["alert"] for rule in alert_rules() if rule["alert"] in TRUE_UNDER_TRAFFIC
                      and not prometheus.query(rule["expr"])["data"]["result"]]
            assert not silent, f"alert expressions false although the traffic made them true: {silent}"
            healthy = SILENT_UNDER_TRAFFIC - (set() if worker.metric("sgw_code_sandbox_available") == 1
                                              else {"ScorerCodeSandboxUnavailable"})  # no bwrap here
            firing = [rule["alert"] for rule in alert_rules() if rule["alert"] in healthy
                      and prometheus.query(rule["expr"])["data"]["result"]]
            assert not firing, f"alert expressions true although nothing they watch is wrong: {firing}"
            evaluated = {r["name"]: r for r in prometheus.rules()}
            assert set(evaluated) == {r["alert"] for r in alert_rules()}
            unhealthy = {name: r.get("lastError") for name, r in evaluated.items() if r["health"] != "ok"}
            assert not unhealthy, f"rules Prometheus cannot evaluate: {unhealthy}"

            # What the processes expose passes promtool's lint.
            for name, url in (("worker", worker.url), ("api", api.url)):
                ok, said = promtool_check_metrics(url)
                assert ok, f"{name}: {said}"
            print(f"\nprometheus live check: {len(dashboard_exprs())} panel expressions with data, "
                  f"{len(alert_rules())} alert rules evaluated")
        finally:
            if prometheus is not None:
                prometheus.stop()
            api.stop()
            code = worker.stop()
        assert code == 0, worker.logs()
