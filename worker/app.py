"""The worker process, wiring and lifecycle: one module, so that ``run``'s named steps read in order.

``run`` is a short list of named steps: connect, make sure the topics exist, start the parts,
consume until told to stop, then shut down gracefully - stop fetching, let in-flight traces
finish within ``SGW_SHUTDOWN_TIMEOUT_S``, cancel the rest, commit what finished, close.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.metadata
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError
from redis.exceptions import AuthenticationError, RedisClusterException
from redis.exceptions import ConnectionError as RedisConnectionError

from adapters.members.sandbox import SandboxPool
from adapters.stores.alerts import NoScoreAlerts
from adapters.stores.backfills import BackfillStore, JobParts
from adapters.stores.catalog import CatalogStore, CatalogWatcher
from adapters.stores.claims import Claims
from adapters.stores.client import RedisClient
from adapters.stores.digests import DigestStore
from adapters.stores.incidents import IncidentStore
from adapters.stores.ratings import RatingsStore
from adapters.stores.review_items import ReviewItems
from adapters.stores.sessions import SessionStore
from adapters.stores.shards import ShardLeases
from consumers.backfill import BackfillRunner
from consumers.digests import DigestSender
from consumers.fleet_share import FleetShare
from consumers.incidents import IncidentWatcher
from consumers.judge_export import JudgeCallExporter
from consumers.label_export import LabelExporter
from consumers.loop import MAX_POLL_INTERVAL_S
from consumers.outage import OutageGuard
from consumers.outputs import BACKFILL, BACKFILL_ALERTING, Outputs, PublishPolicy, TopicNames
from consumers.pair_protocol import PairProtocol
from consumers.sessions import SessionSweeper
from consumers.shadow_sweep import ShadowSweep
from consumers.traces import OutputError, TraceConsumer, TraceLoopLimits
from consumers.webhooks import WebhookSender
from scoring.redact import mask_url
from worker import metrics
from worker.connections import kafka_admin, kafka_consumer, kafka_producer, redis_client
from worker.engine import ScoringEngine
from worker.hot_path import hot_path_build
from worker.logs import kafka_errors_kept
from worker.loop_stall import watch_loop_stalls
from worker.otlp import otlp_intake, run_otlp_intake
from worker.settings import Settings
from worker.shutdown import WATCHDOG_GRACE_S, ShutdownWatchdog, close_all, end_tasks
from worker.webhooks import webhook_sender

# Nearly all that a batch allocates dies with it, freed by reference counting: at the default
# threshold (700 allocations) the cycle collector ran dozens of times a batch to find nothing.
# Measured in-process on the benchmark's traces: the steps of a trace (decode, route, score,
# encode) cost ~15% less CPU with these; the deterministic benchmark measures the whole.
GC_THRESHOLDS = (20_000, 20, 20)

log = structlog.get_logger(__name__)

STALLED_AFTER_S = 30.0  # /readyz turns false when the loop has not ticked for this long


def dead_letter_limit(settings: Settings) -> int:
    """Bytes a dead letter may take: a trace at the size limit, base64-encoded, with room."""
    return 4 * settings.max_trace_bytes + 65_536


def topic_replication(wanted: int, brokers: int) -> tuple[int, dict[str, str]]:
    """The replication factor of a topic the worker creates - ``wanted``, at most one replica per
    broker - and its ``min.insync.replicas``: 2 from 3 replicas on (with acks=all a record is on
    two brokers before it counts, and one broker may be down), else 1 (2 of 2 would stop every
    write while either broker is down)."""
    factor = max(1, min(wanted, brokers))
    return factor, {"min.insync.replicas": "2" if factor >= 3 else "1"}


class StartupError(Exception):
    """The worker cannot start as configured; the message says which setting and why (the CLI
    prints it as one line and exits 2, no traceback)."""


# What a failed first connection to Kafka says, and the settings to look at.
CONNECT_HINTS = (
    ("SaslAuthenticationFailed", "check SGW_KAFKA_SASL_USERNAME, SGW_KAFKA_SASL_PASSWORD and SGW_KAFKA_SASL_MECHANISM"),
    ("UnsupportedSaslMechanism", "SGW_KAFKA_SASL_MECHANISM is not one the brokers enable"),
    ("CERTIFICATE_VERIFY_FAILED", "the brokers' certificate is not trusted: set SGW_KAFKA_SSL_CA_FILE to the CA "
                                  "that signed it (and check the host name it names)"),
    ("SSL", "check SGW_KAFKA_SECURITY_PROTOCOL (the listener may not speak TLS) and SGW_KAFKA_SSL_*"),
)


async def redis_accepts(redis: RedisClient, settings: Settings) -> None:
    """A first PING: refused credentials or an untrusted certificate end the start with the
    setting to look at (an unreachable Redis is left to the callers' outage rule)."""
    try:
        await redis.ping()
    except (AuthenticationError, RedisConnectionError, RedisClusterException) as exc:
        # A cluster client says the same things inside its own exception: read the words.
        said = str(exc)
        if isinstance(exc, AuthenticationError) or "username-password" in said or "WRONGPASS" in said:
            raise StartupError(f"Redis refused the user and password in SGW_REDIS_URL "
                               f"({mask_url(settings.redis_url)}): {said}") from None
        if "CERTIFICATE_VERIFY_FAILED" in said or "SSL" in said:
            raise StartupError(f"Redis's certificate is not trusted or TLS failed ({mask_url(settings.redis_url)}): "
                               f"{said}; set SGW_REDIS_CA_FILE to the CA that signed it") from None
        raise


# One bootstrap attempt's bound: one that gets no answer in time (seen once in a few hundred
# starts on a loaded machine: a TLS bootstrap that never returned, under aiokafka's own timeouts)
# is abandoned and made again with a new client.
CONNECT_ATTEMPT_S = 20.0
CONNECT_ATTEMPTS = 3


async def connected_admin(settings: Settings) -> AIOKafkaAdminClient:
    """An admin client started against the brokers. A first connection that fails becomes one
    StartupError naming what to check, instead of aiokafka's line per attempt and a traceback."""
    with kafka_errors_kept() as kept:
        for _ in range(CONNECT_ATTEMPTS):
            client = kafka_admin(settings)
            starting = asyncio.ensure_future(client.start())
            done, _ = await asyncio.wait({starting}, timeout=CONNECT_ATTEMPT_S)
            if not done:  # abandoned, not awaited: its cancellation is what might not return
                starting.cancel()
                continue
            failure = starting.exception()
            if failure is None:
                return client
            if not isinstance(failure, KafkaError):
                raise failure
            _refused(settings, kept[-1] if kept else str(failure))
        _refused(settings, kept[-1] if kept else
                 f"no answer in {CONNECT_ATTEMPTS} attempts of {CONNECT_ATTEMPT_S:.0f} s")
    raise AssertionError("unreachable")  # _refused raises


def _refused(settings: Settings, cause: str) -> NoReturn:
    hint = next((h for marker, h in CONNECT_HINTS if marker in cause),
                "check SGW_KAFKA_BOOTSTRAP and SGW_KAFKA_SECURITY_PROTOCOL")
    raise StartupError(f"cannot connect to Kafka at {settings.kafka_bootstrap} "
                       f"({settings.kafka_security_protocol}): {cause}; {hint}")


async def ensure_topics(settings: Settings) -> None:
    """Create the topics the worker reads and writes if they are missing - or, with
    ``SGW_CREATE_TOPICS=false``, check that they exist."""
    wanted = [settings.traces_topic, settings.ratings_topic, settings.signals_topic,
              settings.webhooks_topic, settings.dlq_topic, settings.webhooks_dlq_topic]
    if settings.otlp_enabled:
        wanted.append(settings.otlp_topic)
    admin = await connected_admin(settings)
    try:
        existing = set(await admin.list_topics())  # those this principal may describe
        missing = [t for t in wanted if t not in existing]
        if missing and not settings.create_topics:
            raise StartupError(f"SGW_CREATE_TOPICS=false and these topics do not exist (or this principal may not "
                               f"describe them): {', '.join(missing)}; create them, or let the worker create "
                               "them (SGW_CREATE_TOPICS=true, with the right to create topics)")
        if missing:
            brokers = len((await admin.describe_cluster()).get("brokers", []))
            factor, replication = topic_replication(settings.topic_replication_factor, brokers)
            if factor < settings.topic_replication_factor:  # a single development broker: expected
                (log.info if brokers == 1 else log.warning)(
                    "fewer brokers than the replication factor; topics get one replica per broker",
                    brokers=brokers, wanted=settings.topic_replication_factor)
            # The dead-letter topic takes whole malformed records (base64 when not text).
            big = {"max.message.bytes": str(dead_letter_limit(settings))}
            with contextlib.suppress(TopicAlreadyExistsError):  # another worker won the race
                await admin.create_topics([NewTopic(t, num_partitions=settings.topic_partitions,
                                                    replication_factor=factor,
                                                    topic_configs=replication | (big if t == settings.dlq_topic
                                                                                 else {}))
                                           for t in missing])
            log.info("created topics", topics=missing, partitions=settings.topic_partitions, replicas=factor)
        await until_settled(admin, wanted, settings.consumer_group)
    finally:
        await admin.close()


async def until_settled(admin: AIOKafkaAdminClient, topics: list[str], group: str, timeout_s: float = 30.0) -> None:
    """Wait (bounded) until every partition of ``topics`` has a leader and ``group``'s
    coordinator answers. New topics are leaderless for a moment, and a fresh broker makes its
    offsets topic on the first group's request: a first produce or join in that moment meets
    errors that are retried, but read like faults. Past the bound the worker goes on: the
    clients retry, and the outage rule reports what lasts."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        described = await admin.describe_topics(topics)
        waiting = [t["topic"] for t in described
                   if t["error_code"] or any(p["error_code"] or p["leader"] < 0 for p in t["partitions"])]
        if not waiting:
            try:
                await admin.find_coordinator(group)
                return
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                waiting = [f"the coordinator of group {group}"]
        if loop.time() > deadline:
            log.info("the cluster is still settling; going on (its clients retry)", waiting=waiting)
            return
        await asyncio.sleep(0.2)


class HasOutage(Protocol):
    @property
    def outage(self) -> str | None: ...


@dataclass
class _Opened:
    """What ``Worker._open`` opened: closed last, by ``Worker._serve``."""

    redis: RedisClient
    ops: metrics.OpsServer
    outages: OutageGuard
    watcher: CatalogWatcher


@dataclass
class _Parts:
    """The clients and loops ``Worker._assemble`` built, for ``Worker._serve`` to start and stop."""

    producer: AIOKafkaProducer
    engine: ScoringEngine
    consumer: AIOKafkaConsumer
    traces: TraceConsumer
    share: FleetShare
    loops: list[tuple[str, Callable[[asyncio.Event], Coroutine[Any, Any, None]]]]
    judge_spans: JudgeCallExporter | None
    hooks_consumer: AIOKafkaConsumer
    hooks: WebhookSender


class Worker:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stop = asyncio.Event()
        self.consumer: TraceConsumer | None = None
        self.sandbox: SandboxPool | None = None
        self.outages: list[HasOutage] = []  # every loop: what each waits for, for /readyz
        self.failed: tuple[str, BaseException] | None = None  # a background loop that ended the worker
        # Drain, then background loops, each within the shutdown timeout; then the clients.
        self.watchdog = ShutdownWatchdog(2 * settings.shutdown_timeout_s + WATCHDOG_GRACE_S)

    def readiness(self) -> tuple[bool, str]:
        c = self.consumer
        if c is None:
            return False, "starting"
        if c.fatal is not None:
            return False, f"stopping after an output failure: {c.fatal}"
        if self.failed is not None:
            return False, f"stopping after a {self.failed[0]} failure: {self.failed[1]}"
        waiting = [loop.outage for loop in self.outages if loop.outage is not None]
        if waiting:
            return False, f"waiting in-process: {'; '.join(dict.fromkeys(waiting))}"
        if not c.assigned_once:
            return False, "waiting for a partition assignment"
        stalled = time.monotonic() - c.last_progress
        if stalled > STALLED_AFTER_S:
            return False, f"consumer loop stalled for {stalled:.0f}s"
        if self.sandbox is not None and not self.sandbox.available:
            # Still ready: every other member kind scores; code members report why they cannot.
            return True, f"ready; code scorers unavailable: {self.sandbox.unavailable_reason}"
        if self.sandbox is not None and self.sandbox.bounds:
            return True, f"ready; code scorers run {self.sandbox.bounds}"  # the bounds in force
        return True, "ready"

    async def run(self) -> int:
        """The process, as four steps: 1. open what every loop needs - the ops endpoint, Redis and
        the catalog, the topics (a start that fails closes what it opened); 2. assemble the
        clients and loops over them; 3. serve - start them, run the trace loop until told to
        stop or a loop fails; 4. drain and close, each within a bound, whatever ended 3."""
        opened = await self._open()
        parts = self._assemble(opened)
        exit_code = await self._serve(opened, parts)
        log.info("worker stopped", exit_code=exit_code)
        return exit_code

    async def _open(self) -> _Opened:
        s = self.settings
        redis = redis_client(s)
        ops = metrics.OpsServer(s.metrics_port, self.readiness)
        await ops.start()
        outage_events = metrics.PrometheusOutages()
        for dependency in ("redis", "kafka"):  # a series from the start: panels and alerts see 0, not nothing
            outage_events.outage(dependency, False)
        # One guard for every loop: one account of what is away, one gauge per dependency.
        outages = OutageGuard(s.outage_tolerance_s, outage_events)
        watcher = CatalogWatcher(CatalogStore(redis), on_lost=metrics.observe_catalog_lost)
        try:
            await redis_accepts(redis, s)
            catalog = await watcher.start()
            # Each start step says it is done: a start that stalls shows where in its last line.
            log.info("Redis answered; catalog loaded", version=catalog.version)
            await ensure_topics(s)
            log.info("Kafka answered; topics ready", bootstrap=s.kafka_bootstrap,
                     protocol=s.kafka_security_protocol)
        except StartupError:  # nothing consumed yet: close what started, each within a bound
            await close_all([("catalog watcher", watcher.stop()), ("metrics server", ops.stop())])
            await close_all([("redis", redis.aclose())])
            raise
        return _Opened(redis=redis, ops=ops, outages=outages, watcher=watcher)

    def _assemble(self, opened: _Opened) -> _Parts:
        s, redis, outages, watcher = self.settings, opened.redis, opened.outages, opened.watcher
        producer = kafka_producer(s, max_request_size=dead_letter_limit(s))
        engine = ScoringEngine(s, observe_judge_call=metrics.observe_judge_call,
                               observe_member=metrics.observe_member, count_tokens=metrics.count_judge_tokens)
        self.sandbox = engine.sandbox
        consumer = kafka_consumer(s, s.consumer_group, max_partition_fetch_bytes=s.max_trace_bytes * 2,
                                  fetch_min_bytes=s.fetch_min_bytes, fetch_max_wait_ms=s.fetch_max_wait_ms,
                                  max_poll_interval_ms=int(MAX_POLL_INTERVAL_S * 1000),
                                  client_id=f"scorer-group-worker-{s.consumer_group}")
        topics = TopicNames(traces=s.traces_topic, ratings=s.ratings_topic, signals=s.signals_topic,
                            webhooks=s.webhooks_topic, dlq=s.dlq_topic)
        claims, ratings = Claims(redis, lease_s=s.claim_lease_s), RatingsStore(redis)
        alerts = NoScoreAlerts(redis, s.no_score_alert_interval_s)
        events = metrics.PrometheusEvents()
        sessions = SessionStore(redis)
        # Judge calls as OpenTelemetry spans, when asked: queued by the outputs, sent in batches.
        judge_spans = (JudgeCallExporter(s.judge_trace_endpoint, headers=s.judge_trace_export_headers(),
                                         service_version=_version(),
                                         events=metrics.PrometheusJudgeExportEvents())
                       if s.judge_trace_export == "otlp" else None)
        self.consumer = traces = TraceConsumer(
            consumer=consumer, producer=producer, topics=topics, catalog=lambda: watcher.current,
            panel=engine.panel, claims=claims, alerts=alerts, ratings=ratings, turns=sessions, events=events,
            outages=outages, judge_calls=judge_spans, limits=TraceLoopLimits(
                max_in_flight=s.trace_room(), max_in_flight_bytes=s.max_in_flight_bytes,
                max_trace_bytes=s.max_trace_bytes, commit_interval_s=s.commit_interval_s,
                max_poll_interval_s=MAX_POLL_INTERVAL_S, max_spans_per_trace=s.max_spans_per_trace))
        # The fleet's background work (incident watches, digests, the session sweep) is split by
        # leases on shards of groups and projects: each piece done by one worker (consumers.fleet_share).
        name = f"{socket.gethostname()}-{os.getpid()}"
        share = FleetShare(ShardLeases(redis), worker=f"{name}-{uuid.uuid4().hex[:6]}", lease_s=s.fleet_lease_s)
        sweeper = SessionSweeper(store=sessions, outputs=Outputs(producer, topics, events, alerts,
                                                                 judge_calls=judge_spans),
                                 catalog=lambda: watcher.current, panel=engine.panel, claims=claims,
                                 ratings=ratings, events=events, interval_s=s.session_sweep_interval_s,
                                 outages=outages, share=share)

        # Backfills: past traffic graded again, by pair protocols of their own whose outputs say
        # origin "backfill", page nobody (unless the job asks) and count at the trace's time
        # (consumers.backfill); a partition of a job is leased for as long as a claim.
        # Its claims fill: a pair rated under the group's current revision is never graded again.
        filling = Claims(redis, lease_s=s.claim_lease_s, fill=True)

        def backfill_pairs(policy: PublishPolicy) -> PairProtocol:
            return PairProtocol(claims=filling, ratings=ratings, panel=engine.panel, outages=outages, events=events,
                                outputs=Outputs(producer, topics, events, alerts, policy=policy,
                                                judge_calls=judge_spans))

        async def live_done() -> dict[int, int]:  # where live scoring has committed, per partition
            admin = kafka_admin(s)
            await admin.start()
            try:
                offsets = await admin.list_consumer_group_offsets(s.consumer_group)
            finally:
                await admin.close()
            return {tp.partition: meta.offset for tp, meta in offsets.items()
                    if tp.topic == s.traces_topic and meta.offset >= 0}

        backfills = BackfillRunner(
            jobs=BackfillStore(redis), parts=JobParts(redis, lease_s=s.claim_lease_s), catalog=lambda: watcher.current,
            pairs=backfill_pairs(BACKFILL), alerting=backfill_pairs(BACKFILL_ALERTING),
            consumer=lambda: kafka_consumer(s, None, max_partition_fetch_bytes=s.max_trace_bytes * 2),
            topic=s.traces_topic, worker=name, max_trace_bytes=s.max_trace_bytes,
            max_spans=s.max_spans_per_trace, live_pressed=traces.pressed, live_done=live_done)

        # Incidents: groups that alert on their level (windows, drift, coverage) or on their judges'
        # agreement with people's labels, once per fleet.
        incidents = IncidentWatcher(store=IncidentStore(redis), ratings=ratings, catalog=lambda: watcher.current,
                                    send=Outputs(producer, topics, events).send, topics=topics,
                                    events=metrics.PrometheusIncidents(), interval_s=s.incident_interval_s,
                                    share=share, reviews=ReviewItems(redis))

        # Digests: a channel with digestSeconds hears a period's Signals of a group in one message.
        digests = DigestSender(digests=DigestStore(redis), ratings=ratings, catalog=lambda: watcher.current,
                               send=Outputs(producer, topics, events).send, topics=topics,
                               interval_s=s.incident_interval_s, share=share)

        # Shadows (alignment runs' candidates on live traffic) leave the catalog once past their time.
        shadows = ShadowSweep(redis=redis, ratings=ratings, catalog=lambda: watcher.current, share=share)

        # Review labels: every version onto the labels topic, from the queues' outboxes in Redis.
        labels = LabelExporter(items=ReviewItems(redis), catalog=lambda: watcher.current,
                               send=Outputs(producer, topics, events).send, topic=s.labels_topic, share=share)

        hooks_consumer = kafka_consumer(s, f"{s.consumer_group}-webhooks")
        hooks = webhook_sender(s, redis, hooks_consumer, producer, lambda: watcher.current, outages)
        self.outages = [traces, hooks]
        # The background loops, each stopped by self.stop (started in this order by _serve).
        loops: list[tuple[str, Callable[[asyncio.Event], Coroutine[Any, Any, None]]]] = [
            ("event-loop stall watch", watch_loop_stalls), ("fleet share", share.run),
            ("session sweeper", sweeper.run), ("backfill runner", backfills.run),
            ("incident watcher", incidents.run), ("digest sender", digests.run),
            ("review label export", labels.run), ("shadow sweep", shadows.run)]
        return _Parts(producer=producer, engine=engine, consumer=consumer, traces=traces, share=share,
                      loops=loops, judge_spans=judge_spans, hooks_consumer=hooks_consumer, hooks=hooks)

    async def _serve(self, opened: _Opened, parts: _Parts) -> int:
        s, traces, consumer = self.settings, parts.traces, parts.consumer
        producer, engine, hooks, hooks_consumer = parts.producer, parts.engine, parts.hooks, parts.hooks_consumer
        judge_spans = parts.judge_spans
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_stop, sig)
        exit_code = 0
        try:
            await producer.start()
            await engine.start()
            metrics.observe_sandbox(engine.sandbox.available)
            consumer.subscribe([s.traces_topic], listener=traces.rebalance_listener())
            await consumer.start()
            build = hot_path_build()
            (log.warning if build.stale else log.info)(
                "worker started", topic=s.traces_topic, group=s.consumer_group,
                catalog_version=opened.watcher.current.version,
                event_loop=type(asyncio.get_running_loop()).__module__.split(".")[0], hot_path=build.describe())
            metrics.observe_hot_path(len(build.compiled), len(build.stale))
            # What startup built (modules, models' schemas, clients: ~85,000 objects) lives as long
            # as the process: out of the collector's sight, a full collection no longer walks it
            # (~26 ms each, measured) - a pause every trace in flight would wait through.
            gc.collect()
            gc.freeze()
            gc.set_threshold(*GC_THRESHOLDS)
            await parts.share.renew()  # this worker's share, before the work that reads it starts
            background = [self._background(name, run(self.stop)) for name, run in parts.loops]
            spans_stop = asyncio.Event()  # told after the drain: the last results' calls are exported too
            if judge_spans is not None:
                background.append(self._background("judge span export", judge_spans.run(spans_stop)))
            if s.send_webhooks:
                hooks_consumer.subscribe([s.webhooks_topic], listener=hooks.rebalance_listener())
                await hooks_consumer.start()
                background.append(self._background("webhook sender", hooks.run(self.stop)))
            if s.otlp_enabled:  # OpenTelemetry spans in, assembled traces out to the traces topic
                intake = otlp_intake(s, opened.redis, producer, opened.outages)
                self.outages.append(intake)
                background.append(self._background("OTLP intake", run_otlp_intake(intake, s, self.stop)))
            try:
                await traces.run(self.stop)
            except OutputError:
                log.exception("stopping: outputs could not be published")
                exit_code = 1
            except Exception:  # Redis or Kafka gone for good: stop, uncommitted work is redelivered
                log.exception("stopping: the consumer loop failed")
                exit_code = 1
            if hooks.failed is not None or self.failed is not None:
                exit_code = 1
            self.stop.set()  # the sweeper and the sender stop with the loop, whatever ended it
            self.watchdog.arm()
            await traces.drain(s.shutdown_timeout_s)
            spans_stop.set()
            if traces.fatal is not None and exit_code == 0:  # a publish failed or hung while draining
                log.error("the loop failed while draining", error=repr(traces.fatal))
                exit_code = 1
            await end_tasks(background, s.shutdown_timeout_s)
            if self.failed is not None and exit_code == 0:  # a background loop failed while stopping
                exit_code = 1
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await close_all([("traces consumer", consumer.stop()), ("webhooks consumer", hooks_consumer.stop()),
                             ("producer", producer.stop()), ("scoring engine", engine.close()),
                             ("catalog watcher", opened.watcher.stop()), ("metrics server", opened.ops.stop())])
            await close_all([("redis", opened.redis.aclose())])  # last: the watcher reads it until it stops
            self.watchdog.disarm()
        return exit_code

    def _background(self, name: str, loop: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A loop beside the trace loop; one that ends with a failure (an outage past its
        tolerance) stops the worker, as the trace loop's would."""
        task = asyncio.create_task(loop, name=name)

        def ended(_: asyncio.Task[None]) -> None:
            failure = None if task.cancelled() else task.exception()
            if failure is not None and self.failed is None:
                self.failed = (name, failure)
                log.error(f"stopping: the {name} failed", error=repr(failure))
                self._request_stop(None)

        task.add_done_callback(ended)
        return task

    def _request_stop(self, sig: signal.Signals | None) -> None:
        log.info("stop requested; finishing in-flight traces", signal=sig.name if sig else "sender failure")
        self.stop.set()
        self.watchdog.arm()



def _version() -> str:
    """This package's version, as installed ("" when run from a tree that was not installed)."""
    try:
        return importlib.metadata.version("scorer-group-worker")
    except importlib.metadata.PackageNotFoundError:
        return ""
