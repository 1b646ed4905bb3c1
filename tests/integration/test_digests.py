"""Digests on real Redis and Kafka, on a driven clock: a channel with digestSeconds
gets one message per group and period - the count of the agent's results below the threshold
and the worst of them - whatever the number of workers; a period without one sends nothing; a
PagerDuty channel takes no digest."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from pydantic import ValidationError
from redis.asyncio import Redis

from adapters.stores import keys
from adapters.stores.digests import PENDING_S, DigestStore
from adapters.stores.ratings import RatingsStore
from consumers.digests import DigestSender
from consumers.events import Silent
from consumers.outputs import Outputs, TopicNames
from scoring.catalog import CatalogSnapshot
from scoring.models import AlertChannel, ScorerGroup
from scoring.results import HistoryEntry
from tests.support.harness import read_topic

pytestmark = pytest.mark.integration

PERIOD_S = 60


def snapshot(unique: str) -> tuple[ScorerGroup, CatalogSnapshot]:
    group = ScorerGroup.model_validate({
        "id": f"g-{unique}", "name": "Release bar", "projectId": f"p-{unique}",
        "members": [{"kind": "pattern", "refId": "x", "weight": 1}],
        "online": {"enabled": True, "sampleRate": 1, "alertThreshold": 6, "severity": "high"}})
    digest = AlertChannel.model_validate({"agentId": "support", "url": "https://hooks.example/digest",
                                          "projectId": group.project_id, "format": "slack",
                                          "digestSeconds": PERIOD_S})
    elsewhere = AlertChannel.model_validate({"agentId": "support", "url": "https://hooks.example/theirs",
                                             "projectId": f"other-{unique}", "digestSeconds": PERIOD_S})
    return group, CatalogSnapshot(groups={group.id: group}, channels={"d": digest, "e": elsewhere})


async def results(redis: Redis, group: ScorerGroup, at: float, agent: str, scores: list[float]) -> None:
    entries = []
    for n, score in enumerate(scores):
        doc = {"id": f"r-{agent}-{at}-{n}", "agentId": agent, "scope": "trace", "traceId": f"t-{agent}-{n}",
               "scoredAt": datetime.fromtimestamp(at, UTC).isoformat(), "rating": score,
               "justification": f"blend {score}"}
        entries.append(HistoryEntry(group.id, score, score < 6, at, orjson.dumps(doc)))
    await RatingsStore(redis).write(entries)


async def test_a_digest_channel_gets_one_message_per_period_with_the_count_and_the_worst(
        redis: Redis, kafka_bootstrap: str, unique: str) -> None:
    group, snap = snapshot(unique)
    topics = TopicNames(traces="-", ratings="-", signals="-", webhooks=f"digest-hooks-{unique}", dlq="-")
    period = int(time.time()) // PERIOD_S - 2  # a closed period, two minutes back
    start = period * PERIOD_S
    await results(redis, group, start + 5, "support", [3.0, 2.0, 5.0])
    await results(redis, group, start + 30, "support", [1.0, 4.0, 8.0])  # 8.0: not below
    await results(redis, group, start + 31, "another-agent", [0.5])  # another agent's: not its channel's
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        clock = [start + PERIOD_S + 10.0]
        senders = [DigestSender(digests=DigestStore(redis), ratings=RatingsStore(redis), catalog=lambda: snap,
                                send=Outputs(producer, topics, Silent()).send, topics=topics,
                                clock=lambda: clock[0]) for _ in range(3)]
        for _ in range(2):
            await asyncio.gather(*(s.tick() for s in senders))  # three workers, twice: one message
        clock[0] += PERIOD_S  # the next period: nothing below the threshold, nothing sent
        await asyncio.gather(*(s.tick() for s in senders))
        sent = await read_topic(kafka_bootstrap, topics.webhooks, until=lambda v: len(v) >= 1, settle_s=2)
    finally:
        await producer.stop()
    (delivery,) = sent
    signal: dict[str, Any] = delivery["signal"]
    assert delivery["event"] == "scorer_group.digest" and delivery["url"] == "https://hooks.example/digest"
    assert (signal["digestCount"], signal["rating"], signal["traceId"]) == (5, 1.0, "t-support-0")
    assert signal["justification"].startswith("5 results below 6 in 1 min")


def test_a_pagerduty_channel_takes_no_digest() -> None:
    with pytest.raises(ValidationError, match="digestSeconds"):
        AlertChannel.model_validate({"agentId": "a", "url": "https://events.pagerduty.com/v2/enqueue",
                                     "format": "pagerduty", "routingKey": "k" * 32, "digestSeconds": 300})


async def test_a_pending_claim_is_dated_by_redis_clock_and_taken_again_once_stale(redis: Redis, unique: str) -> None:
    """A sender that died after claiming leaves ``pending:<Redis's seconds>``: another sender
    may take the period once that is PENDING_S old on Redis's clock, not before; a sent period
    is never taken again."""
    store = DigestStore(redis)
    seconds, _ = await redis.time()
    key = keys.digest_period(f"g-{unique}", "c", 7)
    await redis.set(key, f"pending:{seconds - PENDING_S + 5}")  # a live sender's, by Redis's clock
    assert await store.settled(f"g-{unique}", "c", 7)
    assert not await store.claim(f"g-{unique}", "c", 7), "a live sender has it"
    await redis.set(key, f"pending:{seconds - PENDING_S - 5}")  # its sender died
    assert not await store.settled(f"g-{unique}", "c", 7)
    assert await store.claim(f"g-{unique}", "c", 7), "a stale claim is taken again"
    assert not await store.claim(f"g-{unique}", "c", 7), "and then it is this sender's"
    await store.sent(f"g-{unique}", "c", 7)
    assert await store.settled(f"g-{unique}", "c", 7) and not await store.claim(f"g-{unique}", "c", 7)
