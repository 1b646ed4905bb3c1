"""Every store on a real Redis Cluster (three primaries, a replica each), in ./dev test: each Lua
script runs there - the keys it touches share a slot, so no CROSSSLOT - including after the
nodes forgot every script; the schedule and the hot keys spread over the primaries; a primary
killed mid-use fails over to its replica and the stores carry on.

(The whole Redis-touching suite runs on clusters too: ``./dev test-cluster``.)"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from redis import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError

import adapters.stores.review_items as review_items_module
from adapters.stores import keys
from adapters.stores.alerts import NoScoreAlerts
from adapters.stores.alignments import AlignmentStore
from adapters.stores.backfills import BackfillStore, JobParts
from adapters.stores.catalog import CatalogStore, SnapshotCache
from adapters.stores.claims import Claims, Reservation
from adapters.stores.deliveries import DeliverySchedule, PendingDelivery, shard_of
from adapters.stores.digests import DigestStore
from adapters.stores.incidents import IncidentStore
from adapters.stores.keys import SHARDS
from adapters.stores.otlp_buffer import OtlpBuffer
from adapters.stores.quotas import ProjectStorage, Quotas
from adapters.stores.ratings import RatingsStore, SessionVerdict
from adapters.stores.review_items import ReviewItems
from adapters.stores.sessions import SessionStore
from adapters.stores.shards import ShardLeases
from adapters.stores.verdicts import Paid, VerdictStore
from devtools.redis_servers import LocalRedisCluster
from scorer_groups.alignments import Alignment
from scorer_groups.api_models import BackfillCreate
from scorer_groups.review_queues import ReviewItem, ReviewQueue
from scoring.claim_request import ClaimRequest, day_of
from scoring.incidents import Watch
from scoring.models import Judge
from scoring.otlp.mapping import BufferedSpan
from scoring.results import HistoryEntry, Signal, build_deliveries
from scoring.subjects import Span, Trace
from scoring.verdict_cache import CachedVerdict, CachePolicy
from scoring.webhooks.retries import RetrySchedule
from services.groups import MonitorClient

pytestmark = pytest.mark.integration

STORES_DIR = Path(__file__).resolve().parents[2] / "adapters" / "stores"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRedisCluster]:
    started = LocalRedisCluster().start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def client(cluster: LocalRedisCluster) -> AsyncIterator[RedisCluster]:
    cluster.flush()
    redis = RedisCluster.from_url(cluster.url, socket_timeout=5, socket_connect_timeout=5)
    try:
        yield redis
    finally:
        await redis.aclose()


def claim(project: str, subject: str, calls: int = 2) -> ClaimRequest:
    return ClaimRequest(project_id=project, group_id="g", subject_key=f"trace:{subject}", judge_calls=calls,
                        calls_cap=100, budget_window_s=3600, day=day_of(time.time()))


def turn(project: str, session: str, n: int) -> Trace:
    return Trace(trace_id=f"t{n}", project_id=project, agent_id="a", session_id=session,
                 timestamp=datetime.now(UTC), spans=[Span(span_id="r", input="q", output=f"answer {n}")])


def delivery(n: int) -> PendingDelivery:
    signal = Signal(id=f"s-{n}", key="scorer-group:g", group_id="g", group_name="G", project_id="p", agent_id="a",
                    scope="trace", trace_id=f"t-{n}", rating=1.0, alert_threshold=5.0, severity="low",
                    justification="j", rating_id=f"r-{n}", raised_at=datetime.now(UTC))
    return PendingDelivery(delivery=build_deliveries(signal, [f"https://hooks.example.com/{n}"])[0],
                           first_seen=datetime.now(UTC))


async def use_every_store(redis: RedisCluster) -> list[AsyncScript]:
    """Each store's every operation that runs a script, on keys of several projects, groups and
    channels (so of several slots and nodes); returns the scripts the stores registered."""
    now = time.time()
    claims = Claims(redis, lease_s=30)
    requests = [claim(f"p{n}", f"t{n}") for n in range(6)]
    results = await claims.claim_many(requests, now=now)
    assert [r.state for r in results] == ["claimed"] * 6
    assert await claims.confirm(requests[:3]) == [True] * 3
    await claims.mark_done([(r, f"rating-{i}") for i, r in enumerate(requests[:3])], now=now)
    await claims.release(requests[3:])
    assert await claims.reserve_many([Reservation(requests[0], 1, 0, False)], now=now) == [True]

    # The verdict cache: kept per project, read by the claim beside its budget and claims.
    verdicts = VerdictStore(redis, CachePolicy(ttl_s=60, max_entries=2))
    await verdicts.store([Paid(f"p{n}", f"k{n}", CachedVerdict(7.0, "ok", f"r{n}")) for n in range(6)])
    assert await verdicts.lookup("p1", ["k1", "k0"]) == {"k1": CachedVerdict(7.0, "ok", "r1")}
    looked = await claims.claim_many([claim(f"p{n}", f"v{n}") for n in range(6)], now=now,
                                     lookups=[[(f"k{n}", 0), ("missing", 0)] for n in range(6)],
                                     verdict_buckets=verdicts.policy.reading(time.time()))
    assert [dict(r.cached) for r in looked] == [{f"k{n}": CachedVerdict(7.0, "ok", f"r{n}").encode()} for n in range(6)]
    assert [r.leads for r in looked] == [("missing",)] * 6, "each pair pays for its one miss only"

    ratings = RatingsStore(redis)
    await ratings.write([HistoryEntry(f"g{n}", 7.0, False, now, b'{"id":"r"}', rating_id="r", calls=b"[]")
                         for n in range(6)], [SessionVerdict("s1", "g1", 7.0, "r1", now)])
    await ratings.write_counts(now, skipped={"g1": 2})
    assert (await ratings.history("g1", "1h", now=now)).count == 1
    assert await ratings.results("g1") == ([b'{"id":"r"}'], None)
    assert await ratings.result("g1", "r") == (b'{"id":"r"}', b"[]")

    sessions = SessionStore(redis)
    await sessions.add_turns([turn(f"p{n}", f"s{n}", n) for n in range(6)], now=now - 60)
    assert [q.session_id for q in await sessions.quiet("p2", 30, now=now)] == ["s2"]
    await sessions.forget("p2", ["s2"], not_after=now)
    await sessions.reindex("p2", (await sessions.open_projects())["p2"])
    assert "p2" not in await sessions.open_projects() and "p3" in await sessions.open_projects()

    buffer = OtlpBuffer(redis, quiet_s=0.05, max_wait_s=1, lease_s=5, prefix="cluster-otlp")
    spans = [BufferedSpan(trace_id=f"t{n}", project_id="p", service="svc", span=Span(span_id="r", output="x"))
             for n in range(20)]
    assert (await buffer.add(spans)).added == 20
    await asyncio.sleep(0.1)
    due = await buffer.claim_due()
    assert len(due) == 20
    await buffer.finish(due)

    schedule = DeliverySchedule(redis, lease_s=1, schedule=RetrySchedule.parse("5s"))
    items = [delivery(n) for n in range(20)]
    assert all(await schedule.add_claimed(items, now - 10))
    assert len(await schedule.claim_due(now, 100)) == 20

    alerts = NoScoreAlerts(redis, interval_s=60)
    assert await alerts.due([(f"p{n}", "g", f"sig-{n}") for n in range(6)]) == {f"sig-{n}" for n in range(6)}

    jobs, parts = BackfillStore(redis), JobParts(redis)
    window = BackfillCreate.model_validate({"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"})
    job = await jobs.create("g1", "p1", window, 1.0)
    await parts.save_plan(job.id, {0: (0, 10), 1: (5, 9)}, ["a note"])
    assert await parts.lease(job.id, 0, "w-1") and not await parts.lease(job.id, 0, "w-2")
    assert await parts.reserve_calls(job.id, 3, [2, 2]) == 1
    await parts.advance(job.id, 0, 4, tracesRead=4, pairsScored=1)
    assert await parts.pause(job.id, datetime.now(UTC)) and await parts.resume(job.id)
    assert (await jobs.of_group("g1"))[0].progress.traces_read == 4
    assert (await jobs.cancel(job.id)).status == "cancelled"

    incidents = IncidentStore(redis)
    assert await incidents.move("g1", "window_below", Watch(), Watch("inc-1", now, 1), {"signal": {}}, {"id": "inc-1"})
    await incidents.published("g1", "window_below", 1)
    assert (await incidents.window("g1", now - 60, now, now)).results == 1

    digests = DigestStore(redis)
    assert not await digests.settled("g1", "c1", 1)
    assert await digests.claim("g1", "c1", 1) and not await digests.claim("g1", "c1", 1)
    await digests.sent("g1", "c1", 1)

    queue = ReviewQueue.model_validate({"id": "q-cluster", "name": "Q", "projectId": "p1", "groupIds": ["g1"],
                                        "rule": {"below": True}})
    item = ReviewItem.model_validate({
        "id": "q-cluster:00000000-0000-5000-8000-000000000001", "queueId": queue.id, "projectId": "p1",
        "groupId": "g1", "ratingId": "r", "reason": "below", "origin": "live", "createdAt": "2026-12-06T10:00:00Z",
        "subject": {"scope": "trace", "traceId": "t", "input": "q", "output": "a"},
        "rating": {"id": "r", "groupId": "g1", "groupName": "G", "projectId": "p1", "agentId": "a", "scope": "trace",
                   "kind": "k", "rating": 2.0, "reason": None, "justification": "", "members": [],
                   "scoredAt": "2026-12-06T10:00:00Z"}})
    reviews = ReviewItems(redis)
    assert (await reviews.take([(item, queue)], now))[0].taken == 1
    assert (await reviews.next(queue, "k1", now) or ("", 0))[0] == item.id
    assert (await reviews.label(queue, item.id, "k1", b'{"rating": 3, "itemId": "x"}', now)).done
    assert await reviews.view(queue, item.id) is not None and len(await reviews.labelled(queue)) == 1
    assert len(await reviews.labelled_items(queue, 10)) == 1
    exported = await reviews.outbox(queue)
    await reviews.exported(queue, [entry_id for entry_id, _ in exported])
    await reviews.settle(queue)
    assert await reviews.mark_unexported([queue], now) == 0
    await reviews.forget(queue)

    cache = SnapshotCache()
    catalog = CatalogStore(redis, cache=cache)
    await catalog.snapshot()  # read whole, then by the changes since
    await MonitorClient(redis).scorers.put(Judge(id="cluster-judge", name="J", criteria="Helpful?"))
    assert "cluster-judge" in (await catalog.snapshot()).judges
    turned = Judge(id="turn-judge", name="J", criteria="Helpful?")
    await catalog.write(lambda _: [("judges", turned.id, turned)])  # the fleet's write turn, taken and given
    alignments = AlignmentStore(redis)
    run = Alignment.model_validate({
        "id": "al-cluster", "judgeId": "cluster-judge", "projectId": "p1", "state": "running", "source": "x",
        "mark": 5, "candidate": {}, "judgeEtag": "e", "createdAt": datetime.now(UTC),
        "updatedAt": datetime.now(UTC)})
    await alignments.check_place("p1")
    await alignments.begin(run)
    assert await alignments.lease(run.judge_id, run.id, "w-1") and not await alignments.lease(run.judge_id, run.id, "w-2")
    await alignments.end(run.judge_id, run.id)

    leases = ShardLeases(redis)
    assert len(await leases.renew("w-1", 30)) == SHARDS
    await leases.leave("w-1")

    storage = ProjectStorage(redis, Quotas(datasets=5, runs=5, stored_bytes=10_000))
    async with storage.reserved("p1", "dataset", 100):
        pass
    await storage.check("p1", "run")

    stores = (claims, ratings, sessions, buffer, schedule, alerts, jobs, parts, incidents, digests, reviews, catalog,
              cache.fleet_turn, alignments, leases, verdicts, storage)
    return [v for store in stores for v in vars(store).values() if isinstance(v, AsyncScript)]


def registered_in_source() -> int:
    return sum(len(re.findall(r"register_script\(", path.read_text())) for path in STORES_DIR.glob("*.py"))


def scripts_known(cluster: LocalRedisCluster, scripts: list[AsyncScript]) -> list[list[bool]]:
    """For each script, whether each primary knows it."""
    by_node = []
    for node in cluster.primaries():
        with Redis(port=node.port) as plain:
            by_node.append(plain.script_exists(*(s.sha for s in scripts)))
    return [list(known) for known in zip(*by_node, strict=True)]


async def test_every_script_runs_on_a_cluster_even_after_the_nodes_forgot_them(
        cluster: LocalRedisCluster, client: RedisCluster) -> None:
    for node in cluster.primaries():
        with Redis(port=node.port) as plain:
            plain.script_flush()
    scripts = await use_every_store(client)  # raises on CROSSSLOT (redis-py refuses before sending)
    assert len(scripts) == registered_in_source(), "every script of adapters/stores was used above"
    # Nothing loads a script but a NOSCRIPT answer to running it: every one ran, on every
    # primary (a script's keys are on one node; the fallback loads it on all) - but a label's,
    # run on one connection to its node (then WAIT on it: adapters.stores.client.one_connection).
    one_node = {hashlib.sha1(review_items_module._LABEL.encode()).hexdigest()}
    for script, known in zip(scripts, scripts_known(cluster, scripts), strict=True):
        assert all(known) if script.sha not in one_node else any(known), (script.sha, known)


async def test_hot_keys_and_the_webhook_shards_spread_over_the_primaries(cluster: LocalRedisCluster) -> None:
    def owners(names: list[str]) -> set[int]:
        return {cluster.primary_of(name).port for name in names}

    assert len(owners([keys.webhook_due(shard) for shard in range(keys.WEBHOOK_SHARDS)])) == 3
    assert len(owners([keys.dedupe_claims(f"p{n}", 1) for n in range(12)])) == 3, "projects spread"
    assert len(owners([keys.group_results(f"g{n}") for n in range(12)])) == 3, "groups spread"
    assert len({shard_of(delivery(n).delivery) for n in range(40)}) > 8, "channels spread over the shards"


async def test_a_primary_killed_fails_over_and_the_stores_carry_on(
        cluster: LocalRedisCluster, client: RedisCluster) -> None:
    claims = Claims(client, lease_s=30)
    first = claim("p-failover", "t1")
    assert [r.state for r in await claims.claim_many([first])] == ["claimed"]
    await claims.mark_done([(first, "rating-1")])
    await asyncio.sleep(0.5)  # the replica has the write (asynchronous replication)
    hash_key = keys.dedupe_claims("p-failover", first.day)
    killed = cluster.kill_primary_of(hash_key)
    try:
        took = cluster.wait_promoted(hash_key, killed)
        assert took < 20, f"failover took {took:.1f}s"
        second = claim("p-failover", "t2")
        # A call may still meet the connection the crash closed (the worker's outage guard calls
        # again); the next finds the promoted replica by itself.
        errors = []
        for _ in range(3):
            try:
                results = await claims.claim_many([first, second])
                break
            except RedisConnectionError as exc:
                errors.append(exc)
        assert len(errors) <= 1, errors
        assert [r.state for r in results] == ["done", "claimed"], "the done mark survived on the replica"
    finally:
        cluster.restart(killed)
        cluster.wait_ready()
