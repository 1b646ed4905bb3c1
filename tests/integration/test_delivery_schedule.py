"""The durable webhook schedule on the real Redis: a redelivered record is not scheduled twice,
a claim holds a delivery for one lease, retries come due, finished ones stay finished."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from scoring.results import Signal, build_deliveries
from scoring.stores import keys
from scoring.stores.deliveries import Attempt, DeliverySchedule, PendingDelivery
from scoring.webhooks.retries import RetrySchedule

pytestmark = pytest.mark.integration


@pytest.fixture
async def schedule(redis_db_url: str) -> AsyncIterator[DeliverySchedule]:
    redis = Redis.from_url(redis_db_url)
    try:
        yield DeliverySchedule(redis, lease_s=10, schedule=RetrySchedule.parse("5s,30s"))
    finally:
        await redis.aclose()


def pending(n: int, now: float) -> PendingDelivery:
    signal = Signal(id=f"s-{n}", key="scorer-group:g", group_id="g", group_name="G", project_id="p", agent_id="a",
                    scope="trace", trace_id=f"t-{n}", rating=1.0, alert_threshold=5.0, severity="low",
                    justification="j", rating_id=f"r-{n}", raised_at=datetime.now(UTC))
    delivery = build_deliveries(signal, ["https://hooks.example.com/x"])[0]
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

    await schedule.finish(one.delivery.id, "delivered")
    await schedule.finish(two.delivery.id, "dead")
    assert await schedule.add_claimed([one, two], now) == [False, False], "finished deliveries stay finished"
    await schedule.forget_dead([one.delivery.id, two.delivery.id])
    assert await schedule.add_claimed([one, two], now) == [False, True], "a replay lifts only the dead mark"
    assert await schedule._redis.ttl(keys.webhook_pending(two.delivery.id)) > 0, "every key expires"
    assert await schedule._redis.ttl(keys.webhook_done(one.delivery.id)) > 0
    assert await schedule._redis.ttl(keys.WEBHOOK_DUE) > 0
