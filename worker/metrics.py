"""Prometheus metrics and the ops endpoint (/metrics, /healthz, /readyz): one registry, so one long module.

All metrics live in one registry owned by this module, so a test can read them and a second
worker in the same process (tests) does not collide with the default registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import structlog
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from adapters.stores.otlp_buffer import BufferSize
from scoring.ports import TokenUsage
from scoring.webhooks.breaker import STATE_VALUES
from worker.loop_metrics import LoopCounter, LoopHistogram

log = structlog.get_logger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

ReadinessCheck = Callable[[], tuple[bool, str]]


class OpsServer:
    """A tiny HTTP/1.1 server on asyncio: scraping must not depend on the event loop's load
    more than it has to, and it must not pull in a web framework."""

    def __init__(self, port: int, readiness: ReadinessCheck | None = None,
                 host: str = "0.0.0.0") -> None:
        self._port = port
        self._host = host
        self._readiness = readiness or (lambda: (True, "ready"))
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._port)
        log.info("ops endpoint listening", port=self.port, paths=["/metrics", "/healthz", "/readyz"])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), timeout=5)
            while (await asyncio.wait_for(reader.readline(), timeout=5)) not in (b"\r\n", b"\n", b""):
                pass  # headers are not needed
            parts = request_line.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            status, ctype, body = self._route(path)
            head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write(head.encode("latin-1") + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    def _route(self, path: str) -> tuple[str, str, bytes]:
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(REGISTRY)
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            ready, why = self._readiness()
            return ("200 OK" if ready else "503 Service Unavailable"), "text/plain", (why + "\n").encode()
        return "404 Not Found", "text/plain", b"not found\n"


# --- The metrics ------------------------------------------------------------------------------
# Labels are bounded: group and project ids come from the catalog (people create them), member
# failure reasons are folded into a handful of classes by ``failure_class``.

SCORE_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

TRACES_CONSUMED = Counter("sgw_traces_consumed", "Trace records read from Kafka.", registry=REGISTRY)
DEAD_LETTERED = Counter("sgw_traces_dead_lettered", "Records sent to the dead-letter topic.",
                        ["reason"], registry=REGISTRY)
# Loop* metrics are updated several times per trace, from the event loop only: no lock each
# (worker.loop_metrics says why). The others are prometheus_client's own.
KEPT = LoopCounter("sgw_traces_sampled_in", "(trace, group) pairs kept by sampling.", ["project", "group"],
                   registry=REGISTRY)
FILTERED = LoopCounter("sgw_traces_filtered", "Traces a live group's online.filter left out: they cost it nothing.",
                       ["project", "group"], registry=REGISTRY)
GROUPS_SCORED = LoopCounter("sgw_groups_scored", "Group results published.",
                            ["project", "group", "scope", "outcome"], registry=REGISTRY)
RESCORED_AFTER_PAUSE = Counter("sgw_pairs_rescored_after_pause", "Pairs scored again because a member failed "
                               "while the process stood still (SIGSTOP, a VM pause): its deadline counted the pause.",
                               registry=REGISTRY)
GROUPS_SKIPPED = Counter("sgw_groups_skipped", "Pairs not scored, by why (budget, dedupe, span_cap, span_budget, "
                         "regex_budget: the filter's regexes ran out of the trace's matching time).",
                         ["project", "group", "why"], registry=REGISTRY)
REGEX_TEXT_CUT = Counter("sgw_regex_text_cut", "Filter regex searches that read only the start of a long text "
                         "(scoring.regex_work: at most 65,536 characters, fewer for a large regex).", ["project"],
                         registry=REGISTRY)
GROUP_SCORE = LoopHistogram("sgw_group_score", "Group scores (0-10) of scored results.",
                            ["project", "group"], buckets=SCORE_BUCKETS, registry=REGISTRY)
REVIEW_ITEMS = Counter("sgw_review_items", "Results a review queue took (outcome taken), or turned away "
                       "because the queue held its capacity of open items (outcome turned_away).",
                       ["project", "outcome"], registry=REGISTRY)
JUDGE_CACHE_LOOKUPS = Counter("sgw_judge_cache_lookups", "Judge verdicts asked of the verdict cache by the "
                              "scoring of live traffic, sessions, spans and backfills: hit (paid for already: no "
                              "call) or miss (called).", ["project", "result"], registry=REGISTRY)
JUDGE_CACHE_SAVED_CALLS = Counter("sgw_judge_cache_saved_calls", "Judge calls the verdict cache saved (one per hit).",
                                  ["project"], registry=REGISTRY)
JUDGE_CACHE_SAVED_TOKENS = Counter("sgw_judge_cache_saved_tokens", "Judge tokens the verdict cache saved: what the "
                                   "calls that paid for its hits cost, as their APIs reported.", ["project"],
                                   registry=REGISTRY)
JUDGE_COST = Counter("sgw_judge_cost", "What the judge calls behind published results cost, in SGW_CURRENCY "
                     "(SGW_JUDGE_PRICES; calls of an unpriced model are not counted: their cost is unknown).",
                     ["project", "group", "model"], registry=REGISTRY)
SIGNALS = Counter("sgw_signals_raised", "Below-threshold Signals raised.", ["project", "group", "severity"],
                  registry=REGISTRY)
JUDGE_CALLS = Counter("sgw_judge_calls", "Judge calls by outcome.", ["outcome"], registry=REGISTRY)
JUDGE_SPANS = Counter("sgw_judge_spans_exported", "Judge calls exported as OpenTelemetry spans, by outcome "
                      "(sent, dropped: the queue was full, failed: the endpoint refused or was away).", ["outcome"],
                      registry=REGISTRY)
JUDGE_TOKENS = Counter("sgw_judge_tokens", "Judge tokens as the judge API reported them, by project and "
                       "direction (prompt, completion).", ["project", "direction"], registry=REGISTRY)
JUDGE_LATENCY = Histogram("sgw_judge_call_seconds", "Latency of judge calls (retries included).",
                          buckets=LATENCY_BUCKETS, registry=REGISTRY)
MEMBER_FAILURES = Counter("sgw_member_failures", "Members that produced no verdict.", ["kind", "reason"],
                          registry=REGISTRY)
MEMBER_SECONDS = LoopHistogram("sgw_member_seconds", "Time a member took, by kind.", ["kind"],
                               buckets=LATENCY_BUCKETS, registry=REGISTRY)
DEPENDENCY_UNREACHABLE = Gauge(
    "sgw_dependency_unreachable",
    "1 while the worker waits for an unreachable dependency (redis, kafka) instead of exiting.",
    ["dependency"], registry=REGISTRY)
REDIS_CONNECTIONS = Gauge(
    "sgw_redis_connections",
    "This process's pool of connections to Redis (not a Redis Cluster client's), read at scrape time: open "
    "(idle or in use), in_use, and most (its bound: SGW_REDIS_MAX_CONNECTIONS, or what the process drives).",
    ["state"], registry=REGISTRY)
REDIS_CONNECTION_WAITS = Counter(
    "sgw_redis_connection_waits",
    "Redis calls that found every connection of the pool in use and waited for one (back-pressure), by how "
    "the wait ended: got (a connection), deadline (SGW_REDIS_TIMEOUT_S passed; the step is retried).",
    ["outcome"], registry=REGISTRY)
REDIS_CONNECTION_WAIT_SECONDS = Counter(
    "sgw_redis_connection_wait_seconds", "Seconds Redis calls spent waiting for a connection of the pool.",
    registry=REGISTRY)


def meter_redis_pool(open_: Callable[[], int], in_use: Callable[[], int], most: int) -> None:
    """The process's Redis pool, read at scrape time (the last pool built wins: one per process)."""
    REDIS_CONNECTIONS.labels("open").set_function(open_)
    REDIS_CONNECTIONS.labels("in_use").set_function(in_use)
    REDIS_CONNECTIONS.labels("most").set(most)
    for outcome in ("got", "deadline"):  # exported at 0 from the start: a rate over them is never empty
        REDIS_CONNECTION_WAITS.labels(outcome)


CATALOG_LOST = Gauge(
    "sgw_catalog_lost",
    "1 when Redis answered with an empty catalog after a non-empty one (data lost); the last "
    "snapshot is kept.", registry=REGISTRY)
SANDBOX_AVAILABLE = Gauge(
    "sgw_code_sandbox_available",
    "1 when code scorers can run confined; 0 when the sandbox could not be set up (they fail closed).",
    registry=REGISTRY)
HOT_PATH_MODULES = Gauge(
    "sgw_hot_path_compiled_modules",
    "Modules of the per-trace path this worker runs compiled (0: interpreted, at several times the CPU); "
    "build=stale counts those older than their sources (a checkout edited since its build).",
    ["build"], registry=REGISTRY)
IN_FLIGHT = Gauge("sgw_traces_in_flight", "Traces being scored now.", registry=REGISTRY)
CONSUMER_LAG = Gauge("sgw_consumer_lag", "Records behind the end of the partition.", ["topic", "partition"],
                     registry=REGISTRY)
COMMITTED_OFFSET = Gauge("sgw_committed_offset", "Last committed offset.", ["topic", "partition"],
                         registry=REGISTRY)
_last_commit_advance = time.time()
SINCE_COMMIT_ADVANCE = Gauge("sgw_seconds_since_commit_advanced",
                             "Seconds since a committed offset last moved (read at scrape time).",
                             registry=REGISTRY)
SINCE_COMMIT_ADVANCE.set_function(lambda: time.time() - _last_commit_advance)
INGEST_TO_RATING = LoopHistogram("sgw_batch_to_rating_seconds",
                                 "From a trace's batch arriving to its outputs acknowledged and marked done.",
                                 buckets=LATENCY_BUCKETS, registry=REGISTRY)
# The HTTP API (`scorer-worker api`): route templates as labels, never raw ids, so they stay bounded.
API_REQUESTS = Counter("sgw_api_requests", "API requests by route template, method and status.",
                       ["route", "method", "status"], registry=REGISTRY)
API_REQUEST_SECONDS = Histogram("sgw_api_request_seconds", "API request latency by route template.",
                                ["route", "method"], buckets=LATENCY_BUCKETS, registry=REGISTRY)
# Both processes (worker.loop_stall): while the event loop is held, nothing else in the process
# moves - no request answered, no trace scored, no heartbeat sent.
EVENT_LOOP_STALL = Histogram("sgw_event_loop_stall_seconds", "How late the event loop ran a ticker due every "
                             "100 ms: the time something held the loop.",
                             buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=REGISTRY)


def failure_class(reason: str | None) -> str:
    """A member's failure reason, folded into a bounded label."""
    text = (reason or "").lower()
    for needle, label in (("reference deleted", "reference_deleted"), ("sandbox unavailable", "sandbox_unavailable"),
                          ("timed out", "timeout"),
                          ("unreachable", "unreachable"), ("http ", "http_error"),
                          ("url refused", "egress_refused"), ("memory", "memory"),
                          ("crashed", "crash"), ("must be within", "off_scale"),
                          ("rating", "bad_verdict"), ("answer", "bad_verdict"),
                          ("requires an expected", "no_expected"), ("error", "exception")):
        if needle in text:
            return label
    return "other"


# Label children, bound once: ``metric.labels(...)`` validates and locks on every call, and the
# hot path counts several per trace. The keys are bounded as the metrics' own label sets are.
_children: dict[tuple[int, tuple[str, ...]], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    key = (id(metric), labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


class PrometheusEvents:
    """``consumers.events.PipelineEvents`` as Prometheus metrics."""

    def consumed(self, count: int) -> None:
        TRACES_CONSUMED.inc(count)

    def dead_lettered(self, reason: str) -> None:
        DEAD_LETTERED.labels(reason).inc()

    def kept(self, project: str, group: str, count: int = 1) -> None:
        _child(KEPT, project, group).inc(count)

    def filtered(self, project: str, group: str, count: int = 1) -> None:
        _child(FILTERED, project, group).inc(count)

    def group_scored(self, project: str, group: str, scope: str, rating: float | None) -> None:
        _child(GROUPS_SCORED, project, group, scope, "scored" if rating is not None else "no_score").inc()
        if rating is not None:
            _child(GROUP_SCORE, project, group).observe(rating)

    def group_skipped(self, project: str, group: str, why: str, count: int = 1) -> None:
        _child(GROUPS_SKIPPED, project, group, why).inc(count)

    def regex_text_cut(self, project: str, count: int) -> None:
        _child(REGEX_TEXT_CUT, project).inc(count)

    def signal_raised(self, project: str, group: str, severity: str) -> None:
        _child(SIGNALS, project, group, severity).inc()

    def review_items(self, project: str, taken: int, turned_away: int) -> None:
        if taken:
            _child(REVIEW_ITEMS, project, "taken").inc(taken)
        if turned_away:
            _child(REVIEW_ITEMS, project, "turned_away").inc(turned_away)

    def verdict_cache(self, project: str, hits: int, misses: int, tokens_saved: int) -> None:
        if hits:
            _child(JUDGE_CACHE_LOOKUPS, project, "hit").inc(hits)
            _child(JUDGE_CACHE_SAVED_CALLS, project).inc(hits)
        if misses:
            _child(JUDGE_CACHE_LOOKUPS, project, "miss").inc(misses)
        if tokens_saved:
            _child(JUDGE_CACHE_SAVED_TOKENS, project).inc(tokens_saved)

    def judge_cost(self, project: str, group: str, model: str, cost: float) -> None:
        _child(JUDGE_COST, project, group, model).inc(cost)

    def in_flight(self, count: int) -> None:
        IN_FLIGHT.set(count)

    def committed(self, topic: str, partition: int, offset: int) -> None:
        global _last_commit_advance
        COMMITTED_OFFSET.labels(topic, str(partition)).set(offset)
        _last_commit_advance = time.time()

    def lag(self, topic: str, partition: int, lag: int) -> None:
        CONSUMER_LAG.labels(topic, str(partition)).set(lag)

    def latency(self, seconds: float) -> None:
        INGEST_TO_RATING.observe(seconds)

    def rescored_after_pause(self, pairs: int) -> None:
        RESCORED_AFTER_PAUSE.inc(pairs)


# --- OpenTelemetry in ---------------------------------------------------------------------------
OTLP_SPANS = Counter("sgw_otlp_spans_consumed", "OTLP spans read from the exporter's topic.", registry=REGISTRY)
OTLP_LATE = Counter("sgw_otlp_late_spans", "Spans that came after their trace was assembled (not scored).",
                    registry=REGISTRY)
OTLP_DROPPED = Counter("sgw_otlp_dropped_spans", "Spans dropped over a trace's span or byte bound.",
                       registry=REGISTRY)
OTLP_ASSEMBLED = Counter("sgw_otlp_traces_assembled", "Traces assembled from spans, by how (complete, timeout).",
                         ["how"], registry=REGISTRY)
OTLP_BUFFERED = Gauge("sgw_otlp_buffer", "What the assembly buffer holds, by unit (traces, spans, bytes).",
                      ["unit"], registry=REGISTRY)
OTLP_ASSIGNED = Gauge("sgw_otlp_partitions_assigned", "Partitions of the OTLP topic this worker reads.",
                      registry=REGISTRY)
OTLP_DELAY = Histogram("sgw_otlp_assembly_delay_seconds",
                       "From a trace's last span buffered to the assembled trace acknowledged.",
                       buckets=LATENCY_BUCKETS, registry=REGISTRY)


class PrometheusOtlpEvents:
    """``consumers.otlp.OtlpEvents`` as Prometheus metrics."""

    def spans_consumed(self, count: int) -> None:
        OTLP_SPANS.inc(count)

    def spans_late(self, count: int) -> None:
        OTLP_LATE.inc(count)

    def spans_dropped(self, count: int) -> None:
        OTLP_DROPPED.inc(count)

    def dead_lettered(self, reason: str) -> None:
        DEAD_LETTERED.labels(reason).inc()

    def committed(self, topic: str, partition: int, offset: int) -> None:
        """Not a series of its own: ``sgw_committed_offset`` follows the traces topic, and the
        OTLP topic's progress shows as its consumer group's lag on the broker."""

    def assembled(self, complete: bool, delay_s: float) -> None:
        OTLP_ASSEMBLED.labels("complete" if complete else "timeout").inc()
        OTLP_DELAY.observe(delay_s)

    def partitions_assigned(self, count: int) -> None:
        OTLP_ASSIGNED.set(count)

    def buffer_size(self, size: BufferSize) -> None:
        OTLP_BUFFERED.labels("traces").set(size.traces)
        OTLP_BUFFERED.labels("spans").set(size.spans)
        OTLP_BUFFERED.labels("bytes").set(size.bytes)


def observe_member(kind: str, status: str, reason: str | None, seconds: float) -> None:
    """``scoring.panel.MemberObserver``."""
    _child(MEMBER_SECONDS, kind).observe(seconds)
    if status == "failed" or status == "not_scored":
        _child(MEMBER_FAILURES, kind, failure_class(reason)).inc()


class PrometheusOutages:
    """``consumers.outage.OutageEvents``: one guard for every loop, so one gauge per dependency."""

    def outage(self, dependency: str, unreachable: bool) -> None:
        DEPENDENCY_UNREACHABLE.labels(dependency).set(1 if unreachable else 0)


INCIDENT_OPEN = Gauge("sgw_group_incident_open", "1 while a group has an incident open, by reason (window_below, "
                      "coverage, drift); the series goes once it resolves.", ["project", "group", "reason"],
                      registry=REGISTRY)


JUDGE_AGREEMENT = Gauge("sgw_judge_agreement", "A judge member's agreement with people (Spearman) over its group's "
                        "last 50 labelled review items; the series exists while there is a figure.",
                        ["project", "group", "judge"], registry=REGISTRY)
JUDGE_AGREEMENT_ITEMS = Gauge("sgw_judge_agreement_items", "The labelled review items behind sgw_judge_agreement.",
                              ["project", "group", "judge"], registry=REGISTRY)


class PrometheusIncidents:
    """``consumers.incidents.IncidentEvents``: every worker watches every group and exports the
    same state (a panel takes the max over workers)."""

    def incident_open(self, project_id: str, group_id: str, reason: str, is_open: bool) -> None:
        # A series only while an incident is open: /metrics grows with what is wrong, not with
        # the groups that alert (every alerting group held one: 2 MB of /metrics at 50,000).
        if is_open:
            INCIDENT_OPEN.labels(project_id, group_id, reason).set(1)
        else:
            with contextlib.suppress(KeyError):
                INCIDENT_OPEN.remove(project_id, group_id, reason)

    def judge_agreement(self, project_id: str, group_id: str, judge: str, spearman: float | None,
                        items: int) -> None:
        # Exported by the worker whose share holds the group; a series only while there is a figure.
        if spearman is not None:
            JUDGE_AGREEMENT.labels(project_id, group_id, judge).set(spearman)
            JUDGE_AGREEMENT_ITEMS.labels(project_id, group_id, judge).set(items)
        else:
            for gauge in (JUDGE_AGREEMENT, JUDGE_AGREEMENT_ITEMS):
                with contextlib.suppress(KeyError):
                    gauge.remove(project_id, group_id, judge)


def observe_catalog_lost(lost: bool) -> None:
    CATALOG_LOST.set(1 if lost else 0)


def observe_hot_path(compiled: int, stale: int) -> None:
    HOT_PATH_MODULES.labels("compiled").set(compiled)
    HOT_PATH_MODULES.labels("stale").set(stale)


def observe_sandbox(available: bool) -> None:
    SANDBOX_AVAILABLE.set(1 if available else 0)


def observe_judge_call(outcome: str, seconds: float) -> None:
    JUDGE_CALLS.labels(outcome).inc()
    JUDGE_LATENCY.observe(seconds)


def count_judge_tokens(project: str, usage: TokenUsage) -> None:
    if usage.prompt_tokens:
        JUDGE_TOKENS.labels(project, "prompt").inc(usage.prompt_tokens)
    if usage.completion_tokens:
        JUDGE_TOKENS.labels(project, "completion").inc(usage.completion_tokens)


# --- Webhook deliveries (consumers/webhooks.py) ---------------------------------------------------
# channel labels are "[<projectId>/]<agentId>#<8 hex of the URL hash>" (consumers.webhook_lanes.channel_label):
# bounded by the catalog, no credentials.

WEBHOOK_DELIVERIES = Counter("sgw_webhook_deliveries", "Webhook delivery attempts by channel and outcome "
                             "(delivered, failed, rejected, gone, refused).", ["channel", "outcome"],
                             registry=REGISTRY)
WEBHOOK_PENDING = Gauge("sgw_webhook_retries_pending", "Webhook deliveries not yet finished (scheduled in Redis).",
                        registry=REGISTRY)
WEBHOOK_OLDEST = Gauge("sgw_webhook_oldest_pending_seconds", "Age of the oldest unfinished webhook delivery.",
                       registry=REGISTRY)
WEBHOOK_BREAKER = Gauge("sgw_webhook_breaker_state",
                        "Circuit breaker per alert channel: 0 closed, 1 half-open, 2 open.", ["channel"],
                        registry=REGISTRY)
WEBHOOK_DISABLED = Counter("sgw_webhook_channels_disabled", "Alert channels this worker marked disabled.",
                           ["channel"], registry=REGISTRY)


class PrometheusJudgeExportEvents:
    """``consumers.judge_export.JudgeExportEvents`` as Prometheus metrics."""

    def judge_spans(self, outcome: str, count: int) -> None:
        JUDGE_SPANS.labels(outcome).inc(count)


class PrometheusWebhookEvents:
    """``consumers.webhooks.WebhookEvents`` as Prometheus metrics."""

    def delivery(self, channel: str, outcome: str) -> None:
        WEBHOOK_DELIVERIES.labels(channel, outcome).inc()

    def breaker(self, channel: str, state: str) -> None:
        WEBHOOK_BREAKER.labels(channel).set(STATE_VALUES.get(state, 0))  # type: ignore[call-overload]

    def channel_disabled(self, channel: str) -> None:
        WEBHOOK_DISABLED.labels(channel).inc()

    def pending(self, count: int, oldest_s: float) -> None:
        WEBHOOK_PENDING.set(count)
        WEBHOOK_OLDEST.set(oldest_s)
