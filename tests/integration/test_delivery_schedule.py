"""The durable webhook schedule on the real Redis: a redelivered record is not scheduled twice,
a claim holds a delivery for one lease, retries come due, finished ones stay finished."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Literal

import pytest

from adapters.stores import keys
from adapters.stores.deliveries import Attempt, DeliverySchedule, PagerDutyIncident, PendingDelivery, shard_of
from scoring.results import Signal, build_deliveries
from scoring.webhooks.retries import RetrySchedule
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration


@pytest.fixture
async def schedule(redis_db_url: str) -> AsyncIterator[DeliverySchedule]:
    redis = connect(redis_db_url)
    try:
        yield DeliverySchedule(redis, lease_s=10, schedule=RetrySchedule.parse("5s,30s"))
    finally:
        await redis.aclose()


def pending(n: int, now: float, url: str = "https://hooks.example.com/x") -> PendingDelivery:
    signal = Signal(id=f"s-{n}", key="scorer-group:g", group_id="g", group_name="G", project_id="p", agent_id="a",
                    scope="trace", trace_id=f"t-{n}", rating=1.0, alert_threshold=5.0, severity="low",
                    justification="j", rating_id=f"r-{n}", raised_at=datetime.now(UTC))
    delivery = build_deliveries(signal, [url])[0]
    return PendingDelivery(delivery=delivery, first_seen=datetime.fromtimestamp(now, UTC))


async def test_a_delivery_is_scheduled_once_claimed_for_a_lease_and_finished_for_good(
        schedule: DeliverySchedule, unique: str) -> None:
    now = time.time()
    one, two = pending(1, now), pending(2, now)
    assert await schedule.add_claimed([one, two], now) == [True, True]
    assert await schedule.add_claimed([one], now) == [False], "a redelivered record is not scheduled again"
    assert await schedule.claim_due(now + 5, 10) == [], "claimed by the one that added them, for a lease"
    claimed = await schedule.claim_due(now + 11, 10)
    assert sorted(p.delivery.id for p in claimed) == sorted([one.delivery.id, two.delivery.id]), \
        "a lease that ran out (its worker died) lets another worker claim"
    assert await schedule.claim_due(now + 12, 10) == [], "and only one"

    failed = one.with_attempt(Attempt(at=datetime.now(UTC), outcome="failed", status=500, error="HTTP 500"))
    await schedule.retry(failed, now + 30)
    assert await schedule.claim_due(now + 20, 10) == [], "not before its retry time"
    again = {p.delivery.id: p for p in await schedule.claim_due(now + 31, 10)}[one.delivery.id]
    assert again.attempts == failed.attempts, "the attempt history is kept"
    assert await schedule.stats(now + 40) == (2, pytest.approx(40, abs=1))

    await schedule.finish(one.delivery, "delivered")
    await schedule.finish(two.delivery, "dead")
    assert await schedule.add_claimed([one, two], now) == [False, False], "finished deliveries stay finished"
    await schedule.forget_dead([one.delivery, two.delivery])
    assert await schedule.add_claimed([one, two], now) == [False, True], "a replay lifts only the dead mark"
    shard = shard_of(one.delivery)
    assert await schedule._redis.ttl(keys.webhook_pending(shard, two.delivery.id)) > 0, "every key expires"
    assert await schedule._redis.ttl(keys.webhook_done(shard, one.delivery.id)) > 0
    assert await schedule._redis.ttl(keys.webhook_due(shard)) > 0


async def test_channels_spread_over_the_shards_and_a_poll_claims_the_longest_due_of_all(
        schedule: DeliverySchedule) -> None:
    now = time.time()
    items = [pending(n, now - n, f"https://hooks.example.com/channel-{n}") for n in range(40)]
    assert all(await schedule.add_claimed(items, now - 100))
    shards = {shard_of(item.delivery) for item in items}
    assert len(shards) >= 10, f"40 channels land on {len(shards)} of {keys.WEBHOOK_SHARDS} shards"
    for shard in shards:
        assert await schedule._redis.zcard(keys.webhook_due(shard)) >= 1, "each delivery in its channel's shard"
    # Claimed when added, they came due at now - 90 (one lease later); half were due before that.
    await schedule.postpone([item.delivery for item in items[:20]], now - 95)
    first = await schedule.claim_due(now, 20)
    assert sorted(p.delivery.id for p in first) == sorted(i.delivery.id for i in items[:20]), \
        "the longest due first, whatever their shard"
    rest = await schedule.claim_due(now + 1, 100)
    assert sorted(p.delivery.id for p in rest) == sorted(i.delivery.id for i in items[20:])
    assert await schedule.stats(now) == (40, pytest.approx(39, abs=1)), "counted over every shard, oldest first seen"


async def test_a_poll_of_some_shards_claims_only_theirs(schedule: DeliverySchedule) -> None:
    # The sender polls a few shards a tick, in turn: a poll claims what is due there, no more.
    now = time.time()
    items = [pending(n, now, f"https://hooks.example.com/channel-{n}") for n in range(40)]
    assert all(await schedule.add_claimed(items, now - 100))
    polled = sorted({shard_of(item.delivery) for item in items})[:3]
    claimed = await schedule.claim_due(now, 100, polled)
    assert sorted(p.delivery.id for p in claimed) == sorted(
        i.delivery.id for i in items if shard_of(i.delivery) in polled)
    assert len(await schedule.claim_due(now, 100)) == 40 - len(claimed), "the others wait for their turn"


async def test_deliveries_of_the_unsharded_schedule_move_to_their_shards_with_open_incidents(
        schedule: DeliverySchedule) -> None:
    now = time.time()
    redis = schedule._redis
    old = "sgw:webhooks:{webhooks}"
    one, two = pending(1, now - 600), pending(2, now - 300, "https://hooks.example.com/other")
    for item, due_ms in ((one, int(now * 1000) - 5_000), (two, int(now * 1000) + 60_000)):
        await redis.set(f"{old}:pending:{item.delivery.id}", item.to_json(), ex=3600)
        await redis.zadd(f"{old}:due", {item.delivery.id: due_ms})
        await redis.zadd(f"{old}:created", {item.delivery.id: int(item.first_seen.timestamp() * 1000)})
    await redis.set(f"{old}:pending:garbage", b"{not a delivery", ex=3600)  # unreadable: dropped, not fatal
    await redis.zadd(f"{old}:due", {"garbage": int(now * 1000)})
    await redis.set(f"{old}:incident:abc123:scorer-group:g", "1", ex=600)
    await redis.set(f"{old}:incident:gone:scorer-group:g", "1", ex=600)

    assert await schedule.move_unsharded({"abc123": 7}) == 2
    assert await schedule.move_unsharded({"abc123": 7}) == 0, "moved once; a second worker finds nothing"
    claimed = await schedule.claim_due(now, 10)
    assert [p.delivery.id for p in claimed] == [one.delivery.id], "the due one is due, the later one keeps its time"
    await schedule.finish(one.delivery, "delivered")
    assert [p.delivery.id for p in await schedule.claim_due(now + 61, 10)] == [two.delivery.id]
    assert await redis.exists(f"{old}:due", f"{old}:pending:{one.delivery.id}", f"{old}:pending:garbage") == 0, \
        "the old keys are gone, the unreadable one too"
    assert 0 < await redis.ttl(keys.webhook_incident(7, "abc123", "scorer-group:g")) <= 600, \
        "an open incident moved, with its time left"
    assert await redis.exists(f"{old}:incident:gone:scorer-group:g") == 1, \
        "an incident of a channel no longer in the catalog is left to expire"
    assert (await schedule.stats(now))[0] == 1



async def test_a_recovery_resolves_an_incident_opened_under_the_channel_id_without_its_project(
        schedule: DeliverySchedule) -> None:
    # Incidents opened before the project was part of the channel id are keyed by the legacy id
    # (adapters.stores.channels.legacy_channel_id): a recovery closes those as well as new ones.
    now = time.time()
    trigger, *recoveries = [pending(n, now) for n in range(4)]  # one URL: one shard
    shard = shard_of(trigger.delivery)

    def key(channel_hash: str, signal_key: str) -> str:
        return keys.webhook_incident(shard, channel_hash, signal_key)

    def incident(action: Literal["open", "close"], signal_key: str) -> PagerDutyIncident:
        return PagerDutyIncident(action, key("with-project", signal_key), key("legacy", signal_key))

    await schedule._redis.set(key("legacy", "scorer-group:old"), "1", ex=600)
    assert await schedule.add_claimed([trigger], now, [incident("open", "scorer-group:new")]) == [True]
    assert await schedule._redis.exists(key("with-project", "scorer-group:new")) == 1, "opened under the new key"
    closes: list[PagerDutyIncident | None] = [incident("close", f"scorer-group:{k}") for k in ("old", "new", "none")]
    assert await schedule.add_claimed(recoveries, now, closes) == [True, True, False], \
        "the old incident and the new one are resolved; with none open, no recovery is sent"
    assert await schedule._redis.exists(key("legacy", "scorer-group:old"), key("with-project", "scorer-group:new")) == 0
