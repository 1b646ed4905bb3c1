"""The fleet shares its background work, on the real Redis: shard leases split evenly
between the workers that renew them, are handed over when a worker dies (within a lease) or
joins (within a renewal), and given back at once by a worker that stops; two incident watchers
each watch half the groups, every group by exactly one; two digest senders send each channel's
period once; two sweepers sweep each project once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from adapters.stores.client import RedisClient
from adapters.stores.digests import DigestStore
from adapters.stores.incidents import IncidentStore
from adapters.stores.keys import SHARDS, shard_of
from adapters.stores.ratings import RatingsStore
from adapters.stores.shards import ShardLeases
from consumers.digests import DigestSender
from consumers.events import Silent
from consumers.fleet_share import FleetShare
from consumers.incidents import IncidentWatcher
from consumers.outputs import Outputs, TopicNames
from scoring.catalog import CatalogSnapshot
from scoring.incidents import Watch, WindowStats
from scoring.models import AlertChannel, ScorerGroup
from scoring.results import HistoryEntry
from tests.support.harness import read_topic

pytestmark = pytest.mark.integration
# Each test's ``redis_db_client`` is a database of its own: the leases are the fleet's, one per database.

LEASE_S = 1.5
EVERY = frozenset(range(SHARDS))


async def test_two_workers_split_the_shards_and_one_takes_all_once_the_other_dies(redis_db_client: RedisClient) -> None:
    leases = ShardLeases(redis_db_client)
    a = await leases.renew("a", LEASE_S)
    assert a == EVERY  # alone: all of it
    b = await leases.renew("b", LEASE_S)
    assert b == frozenset()  # a joiner takes what is free: nothing yet
    a = await leases.renew("a", LEASE_S)  # a's renewal gives back what is past its fair share
    assert a == frozenset(range(SHARDS // 2))
    b = await leases.renew("b", LEASE_S)
    assert b == EVERY - a

    died_at = time.monotonic()
    while (a := await leases.renew("a", LEASE_S)) != EVERY:  # b renews no more
        assert time.monotonic() - died_at < LEASE_S + 0.5, "the dead worker's share was not taken in a lease"
        await asyncio.sleep(0.1)
    assert await leases.renew("b", LEASE_S) == frozenset()  # back, it waits for its share to be given back


async def test_a_stopping_worker_gives_its_share_back_at_once(redis_db_client: RedisClient) -> None:
    leases = ShardLeases(redis_db_client)
    await leases.renew("a", 60)
    await leases.renew("b", 60)
    await leases.renew("a", 60)
    assert await leases.renew("b", 60) == frozenset(range(SHARDS // 2, SHARDS))
    await leases.leave("b")
    assert await leases.renew("a", 60) == EVERY


async def test_three_workers_hold_every_shard_once(redis_db_client: RedisClient) -> None:
    leases = ShardLeases(redis_db_client)
    held: dict[str, frozenset[int]] = {}
    for _ in range(3):  # a few renewals each, in turn: the shares settle
        for worker in ("a", "b", "c"):
            held[worker] = await leases.renew(worker, 60)
    assert sum(len(h) for h in held.values()) == SHARDS
    assert set().union(*held.values()) == EVERY
    assert max(len(h) for h in held.values()) <= -(-SHARDS // 3)


class Counting(IncidentStore):
    """The real store, counting whose windows each watcher read: a group watched is a window read."""

    def __init__(self, redis: RedisClient, seen: Counter[str]) -> None:
        super().__init__(redis)
        self.seen = seen

    async def window(self, group_id: str, start: float, end: float, now: float) -> WindowStats:
        self.seen[group_id] += 1
        return await super().window(group_id, start, end, now)


def alerting(n: int) -> CatalogSnapshot:
    groups = [ScorerGroup.model_validate({
        "id": f"g-{i}", "name": f"G {i}", "projectId": f"p-{i % 7}",
        "members": [{"kind": "pattern", "refId": "x", "weight": 1}],
        "online": {"enabled": True, "sampleRate": 1, "alertThreshold": 6, "severity": "high",
                   "alertMode": "window", "alertWindowSeconds": 300}}) for i in range(n)]
    return CatalogSnapshot(groups={g.id: g for g in groups})


async def test_two_watchers_watch_each_group_once_and_a_survivor_takes_the_dead_ones_share(
        redis_db_client: RedisClient) -> None:
    snapshot = alerting(60)
    topics = TopicNames(traces="-", ratings="-", signals="-", webhooks="-", dlq="-")
    sent: list[Any] = []

    async def send(records: list[Any]) -> None:  # nothing opens on empty windows: nothing is sent
        sent.extend(records)

    quiet = alerting(5)  # no traffic: nothing to judge, not even read
    quiet = CatalogSnapshot(groups={f"q{k}": g.model_copy(update={"id": f"q{k}"}) for k, g in quiet.groups.items()})
    snapshot = CatalogSnapshot(groups={**snapshot.groups, **quiet.groups})
    now = time.time()
    await RatingsStore(redis_db_client).write([HistoryEntry(g, 7.0, False, now - 30) for g in alerting(60).groups])
    shares = [FleetShare(ShardLeases(redis_db_client), worker, lease_s=LEASE_S) for worker in ("a", "b")]
    for _ in range(2):
        for share in shares:
            await share.renew()
    seen: list[Counter[str]] = [Counter(), Counter()]
    watchers = [IncidentWatcher(store=Counting(redis_db_client, seen[i]), ratings=RatingsStore(redis_db_client),
                                catalog=lambda: snapshot, send=send, topics=topics, share=shares[i])
                for i in range(2)]
    await asyncio.gather(*(w.tick() for w in watchers))
    both = seen[0] + seen[1]
    busy = {g for g in snapshot.groups if not g.startswith("q")}
    assert set(both) == busy and set(both.values()) == {1}, "each group with traffic watched once, idle ones never"
    assert seen[0] and seen[1], "each worker watched its half"
    assert {shard_of(g) for g in seen[0]} <= shares[0].shards and not set(seen[0]) & set(seen[1])
    assert sent == []

    died_at = time.monotonic()  # b stops renewing: a takes its share within a lease
    while shares[0].shards != EVERY:
        assert time.monotonic() - died_at < LEASE_S + 1.0
        await asyncio.sleep(0.2)
        await shares[0].renew()
    seen[0].clear()
    await watchers[0].tick()
    assert set(seen[0]) == busy


async def test_two_senders_with_their_shares_send_each_channels_period_once(
        redis_db_client: RedisClient, kafka_bootstrap: str, unique: str) -> None:
    period_s = 60
    groups = [ScorerGroup.model_validate({
        "id": f"g-{i}-{unique}", "name": f"G {i}", "projectId": f"p-{unique}",
        "members": [{"kind": "pattern", "refId": "x", "weight": 1}],
        "online": {"enabled": True, "sampleRate": 1, "alertThreshold": 6, "severity": "high"}}) for i in range(20)]
    channel = AlertChannel.model_validate({"agentId": "support", "url": "https://hooks.example/digest",
                                           "projectId": f"p-{unique}", "digestSeconds": period_s})
    snapshot = CatalogSnapshot(groups={g.id: g for g in groups}, channels={"d": channel})
    start = (int(time.time()) // period_s - 2) * period_s
    entries = []
    for group in groups:
        doc = {"id": f"r-{group.id}", "agentId": "support", "scope": "trace", "traceId": f"t-{group.id}",
               "scoredAt": datetime.fromtimestamp(start + 5, UTC).isoformat(), "rating": 2.0, "justification": "low"}
        entries.append(HistoryEntry(group.id, 2.0, True, start + 5, orjson.dumps(doc)))
    await RatingsStore(redis_db_client).write(entries)

    topics = TopicNames(traces="-", ratings="-", signals="-", webhooks=f"fleet-digests-{unique}", dlq="-")
    shares = [FleetShare(ShardLeases(redis_db_client), worker, lease_s=60) for worker in ("a", "b")]
    for _ in range(2):
        for share in shares:
            await share.renew()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        senders = [DigestSender(digests=DigestStore(redis_db_client), ratings=RatingsStore(redis_db_client), catalog=lambda: snapshot,
                                send=Outputs(producer, topics, Silent()).send, topics=topics,
                                clock=lambda: start + period_s + 10.0, share=share) for share in shares]
        for _ in range(2):
            await asyncio.gather(*(s.tick() for s in senders))
        sent = await read_topic(kafka_bootstrap, topics.webhooks, until=lambda v: len(v) >= len(groups), settle_s=2)
    finally:
        await producer.stop()
    assert sorted(d["signal"]["groupId"] for d in sent) == sorted(g.id for g in groups)  # each once
    owners = {shares[0].owns(g.id) for g in groups}
    assert owners == {True, False}, "both workers sent some"


class Said:
    """What a watcher exported of its watches: (project, group, reason) -> open."""

    def __init__(self) -> None:
        self.state: dict[tuple[str, str, str], bool] = {}

    def incident_open(self, project_id: str, group_id: str, reason: str, is_open: bool) -> None:
        self.state[(project_id, group_id, reason)] = is_open


async def test_a_resolution_whose_mover_died_is_said_even_when_the_group_went_quiet(redis_db_client: RedisClient) -> None:
    """The mover resolved the incident and died before publishing; the group has no traffic
    since. The watch stays among the open ones until its resolution is published, so a watcher
    looks at it whatever its traffic, and says it."""
    (group,) = alerting(1).groups.values()
    snapshot = CatalogSnapshot(groups={group.id: group})
    store, now = IncidentStore(redis_db_client), time.time()
    opened = Watch("inc-1", now - 600, 1)
    assert await store.move(group.id, "window_below", Watch(), opened, {"signal": {"key": "k"}, "deliveries": []},
                            {"id": "inc-1", "state": "open"})
    await store.published(group.id, "window_below", 1)
    resolution = {"signal": {"key": "scorer-group:g-0", "state": "resolved"}, "deliveries": []}
    assert await store.move(group.id, "window_below", opened, Watch(version=2), resolution,
                            {"id": "inc-1", "state": "resolved"}, now=now - 120)  # ... and its mover died
    assert await store.open_watches() == [(group.id, "window_below")], "open until the resolution is said"

    sent: list[Any] = []

    async def send(records: list[Any]) -> None:
        sent.extend(records)

    said = Said()
    watcher = IncidentWatcher(store=store, ratings=RatingsStore(redis_db_client), catalog=lambda: snapshot, send=send,
                              topics=TopicNames(traces="-", ratings="-", signals="signals", webhooks="-", dlq="-"),
                              events=said, clock=lambda: now)
    await watcher.tick()
    assert [orjson.loads(r.value) for r in sent] == [resolution["signal"]]
    assert await store.open_watches() == []
    assert said.state == {(group.project_id, group.id, "window_below"): False}


async def test_a_watch_handed_to_another_worker_is_no_longer_said_open_from_here(redis_db_client: RedisClient) -> None:
    (group,) = alerting(1).groups.values()
    snapshot = CatalogSnapshot(groups={group.id: group})
    store, now = IncidentStore(redis_db_client), time.time()
    assert await store.move(group.id, "window_below", Watch(), Watch("inc-1", now - 60, 1),
                            {"signal": {"key": "k"}, "deliveries": []}, {"id": "inc-1", "state": "open"})
    await store.published(group.id, "window_below", 1)

    async def send(records: list[Any]) -> None:
        pass

    said, share = Said(), FleetShare.everything()
    watcher = IncidentWatcher(store=store, ratings=RatingsStore(redis_db_client), catalog=lambda: snapshot, send=send,
                              topics=TopicNames(traces="-", ratings="-", signals="-", webhooks="-", dlq="-"),
                              events=said, clock=lambda: now, share=share)
    await watcher.tick()
    assert said.state == {(group.project_id, group.id, "window_below"): True}
    share.shards = frozenset()  # its shard went to another worker: that one says it now
    await watcher.tick()
    assert said.state == {(group.project_id, group.id, "window_below"): False}
